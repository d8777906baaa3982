"""Decoding of request media (images, audio, video) into plain arrays, bounded by MediaLimits.

Runs in the server process, so nothing here may import torch: a runner turns these arrays
into tensors.
"""

from omni.media.audio import decode_audio
from omni.media.image import decode_image
from omni.media.limits import MediaLimits
from omni.media.source import decode_base64, load_media_bytes
from omni.media.video import decode_video, is_video

__all__ = [
    "MediaLimits",
    "decode_audio",
    "decode_base64",
    "decode_image",
    "decode_video",
    "is_video",
    "load_media_bytes",
]
