from __future__ import annotations

import io

import av
import numpy as np
import numpy.typing as npt

from omni.shared.media.errors import MediaError
from omni.shared.media.limits import MediaLimits

SAMPLE_RATE = 16_000
# Formats a client may name (OpenAI's input_audio.format and common extras). FFmpeg probes the
# container itself, so the name is only validated, never trusted.
AUDIO_FORMATS = frozenset({"wav", "mp3", "flac", "ogg", "opus", "webm", "m4a", "aac"})


def decode_audio(
    data: bytes, fmt: str | None, limits: MediaLimits, param: str
) -> npt.NDArray[np.float32]:
    """Mono float32 samples in [-1, 1] at 16 kHz."""
    if fmt is not None and fmt.lower() not in AUDIO_FORMATS:
        raise MediaError(
            f"Unsupported audio format {fmt!r} in {param}; expected one of "
            f"{', '.join(sorted(AUDIO_FORMATS))}.",
            param=param,
        )
    if len(data) > limits.max_bytes:
        raise MediaError(
            f"Audio in {param} is larger than {limits.max_bytes} bytes (max_bytes).", param=param
        )
    try:
        return _decode(data, limits, param)
    except MediaError:
        raise
    except Exception:
        # FFmpegError subclasses, or IndexError/ValueError from a container with no audio.
        raise MediaError(f"could not decode audio in {param}", param=param) from None


def _decode(data: bytes, limits: MediaLimits, param: str) -> npt.NDArray[np.float32]:
    max_samples = int(limits.max_audio_seconds * SAMPLE_RATE)
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.audio[0]
        # The header's duration, when present, refuses a long file before decoding it; the
        # sample count below is the check that cannot be lied to.
        if stream.duration is not None and stream.time_base is not None:
            if float(stream.duration * stream.time_base) > limits.max_audio_seconds + 1:
                raise _too_long(limits, param)
        # Keep the channels and average them ourselves: FFmpeg's own downmix scales each
        # channel by 1/sqrt(2), not the plain mean that librosa and HF feature extractors use.
        resampler = av.AudioResampler(format="fltp", rate=SAMPLE_RATE)
        chunks: list[npt.NDArray[np.float32]] = []
        num_samples = 0
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                chunk = out.to_ndarray().mean(axis=0)  # planar (channels, n) -> (n,)
                chunks.append(chunk)
                num_samples += chunk.shape[0]
                if num_samples > max_samples:
                    raise _too_long(limits, param)
        for out in resampler.resample(None):  # flush the resampler's delay line
            chunks.append(out.to_ndarray().mean(axis=0))
    if not chunks:
        raise MediaError(f"could not decode audio in {param}: no samples", param=param)
    samples = np.concatenate(chunks).astype(np.float32, copy=False)
    if samples.shape[0] > max_samples:
        raise _too_long(limits, param)
    return samples


def _too_long(limits: MediaLimits, param: str) -> MediaError:
    return MediaError(
        f"Audio in {param} is longer than {limits.max_audio_seconds} s (max_audio_seconds).",
        param=param,
    )


def media_duration_s(data: bytes, kind: str) -> float | None:
    """The length in seconds of an audio or video file, from its container (no decoding:
    the stream's duration, else the container's, else the end of its last packet), or None
    when it cannot be read. The reference model's prompt states it (<|..._meta_duration|>)."""
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            streams = container.streams.video if kind == "video" else container.streams.audio
            if not streams:
                return None
            stream = streams[0]
            if stream.duration is not None and stream.time_base is not None:
                return float(stream.duration * stream.time_base)
            if container.duration is not None:
                return container.duration / av.time_base
            end = 0.0
            for packet in container.demux(stream):
                if packet.pts is not None and packet.time_base is not None:
                    end = max(end, float((packet.pts + (packet.duration or 0)) * packet.time_base))
            return end or None
    except Exception:
        return None  # the worker's decode names what is wrong with the file
