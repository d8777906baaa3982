"""Video decoding: frames sampled at limits.video_fps by their timestamps, not every frame.

Memory stays bounded by max_video_frames however long the video is: when the duration is
known the sampling interval is widened up front, and when it is not, the kept frames are
thinned (every other one dropped, interval doubled) whenever they would exceed the limit.
"""

from __future__ import annotations

import io
from typing import cast

import av
import numpy as np
import numpy.typing as npt

from omni.shared.media.errors import MediaError
from omni.shared.media.limits import MediaLimits

Frame = npt.NDArray[np.uint8]  # (H, W, 3) RGB

# ISO-BMFF brands that are still images (HEIF/AVIF), not video, despite the ftyp box.
_IMAGE_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"mif1", b"msf1", b"avif", b"avis"})
_EBML_MAGIC = b"\x1a\x45\xdf\xa3"  # Matroska / WebM
_QUICKTIME_ATOMS = frozenset({b"moov", b"mdat", b"free", b"wide", b"skip"})


def is_video(data: bytes) -> bool:
    """Sniff an mp4/mov/webm/mkv container, e.g. a video sent as an image_url."""
    if data[:4] == _EBML_MAGIC:
        return True
    atom = data[4:8]
    if atom == b"ftyp":
        return data[8:12] not in _IMAGE_BRANDS
    return atom in _QUICKTIME_ATOMS  # old QuickTime files may start without ftyp


def decode_video(
    data: bytes, limits: MediaLimits, param: str
) -> tuple[list[Frame], list[float]]:
    """Sampled RGB frames and their times in seconds from the first frame."""
    if len(data) > limits.max_bytes:
        raise MediaError(
            f"Video in {param} is larger than {limits.max_bytes} bytes (max_bytes).", param=param
        )
    try:
        frames, times = _decode(data, limits, param)
    except MediaError:
        raise
    except Exception:
        # FFmpegError subclasses, or IndexError/ValueError from a container with no video.
        raise MediaError(f"could not decode video in {param}", param=param) from None
    if not frames:
        raise MediaError(f"could not decode video in {param}: no frames", param=param)
    return frames, times


def _decode(data: bytes, limits: MediaLimits, param: str) -> tuple[list[Frame], list[float]]:
    max_frames = limits.max_video_frames
    interval = 1.0 / limits.video_fps
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        if stream.width * stream.height > limits.max_image_pixels:
            raise MediaError(
                f"Video in {param} is {stream.width}x{stream.height}, over the limit of "
                f"{limits.max_image_pixels} pixels per frame (max_image_pixels).",
                param=param,
            )
        duration = _duration_s(container, stream)
        if duration is not None and duration * limits.video_fps > max_frames:
            interval = duration / max_frames  # spread max_frames evenly over the whole video
        frames: list[Frame] = []
        times: list[float] = []
        start: float | None = None
        next_time = 0.0
        for index, frame in enumerate(container.decode(stream)):
            t = frame.time if frame.time is not None else index * interval
            if start is None:
                start = t
            t -= start
            # A frame is kept when it is the first at or past the next sample time; the small
            # slack keeps 0.5 s from being missed as 0.49999 after time-base rounding.
            if t + 1e-6 < next_time:
                continue
            if frame.width * frame.height > limits.max_image_pixels:
                raise MediaError(
                    f"Video in {param} has a frame over max_image_pixels.", param=param
                )
            frames.append(cast(Frame, frame.to_ndarray(format="rgb24")))
            times.append(t)
            while next_time <= t + 1e-6:
                next_time += interval
            if len(frames) > max_frames:
                frames, times = frames[::2], times[::2]
                interval *= 2
                next_time = times[-1] + interval
    return frames, times


def _duration_s(container: av.container.InputContainer, stream: av.VideoStream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None
