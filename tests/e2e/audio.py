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


def spoken(text: str, rate: int = 24000, *, voice: str = "en", silence_s: float = 0.0) -> np.ndarray | None:
    """Speech of the text by espeak-ng (None when it is not installed), mono float32 at rate,
    with silence_s of silence after it."""
    import shutil
    import subprocess

    if shutil.which("espeak-ng") is None:
        return None
    wav = subprocess.run(["espeak-ng", "-v", voice, "--stdout", text], check=True, capture_output=True).stdout
    with av.open(io.BytesIO(wav)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        frames = [r.to_ndarray().reshape(-1) for f in container.decode(audio=0) for r in resampler.resample(f)]
        frames += [r.to_ndarray().reshape(-1) for r in resampler.resample(None)]
    samples = np.concatenate(frames).astype(np.float32)
    return np.concatenate([samples, np.zeros(int(silence_s * rate), dtype=np.float32)])
