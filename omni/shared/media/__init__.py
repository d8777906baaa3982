"""Decoding of request media (images, audio, video) into plain arrays, bounded by MediaLimits;
encoding of generated audio into the formats the API returns (audio_encoding.py).

A shared layer: the server uses it to load and check media, the encoder worker to decode it.
It imports neither torch nor the HTTP API (a test enforces both): errors are MediaError, which
the API turns into a 400 naming the part. Fetching media by URL (source.py, aiohttp's client)
is the server's alone and is imported from omni.modalities.inputs.source, so a worker never loads aiohttp.
"""

from omni.shared.media.audio import decode_audio
from omni.shared.media.audio_encoding import StreamingAudioEncoder, encode_audio, float_to_pcm16
from omni.shared.media.errors import MediaError
from omni.shared.media.image import decode_image
from omni.shared.media.limits import MediaLimits
from omni.shared.media.video import decode_video, is_video

__all__ = [
    "MediaError",
    "MediaLimits",
    "StreamingAudioEncoder",
    "decode_audio",
    "decode_image",
    "decode_video",
    "encode_audio",
    "float_to_pcm16",
    "is_video",
]

