"""Reading back the audio an answer carries (the speech and chat audio tests share it)."""

from __future__ import annotations

import io

import av
import numpy as np


def decoded(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """(mono float samples, sample rate) of encoded audio; raw PCM16 (pcm, pcm16) is 24 kHz."""
    if fmt in ("pcm", "pcm16"):
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767, 24000
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.channels == 1
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(stream)]
        return np.concatenate(frames).astype(np.float32), stream.codec_context.sample_rate
