"""Media made in the tests themselves: tiny, deterministic, no files checked in."""

import io
import wave
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image


def png_bytes(width: int = 32, height: int = 24, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (width, height), color=(200, 10, 10) if mode == "RGB" else 128).save(
        buf, format="PNG"
    )
    return buf.getvalue()


def wav_bytes(seconds: float = 1.0, rate: int = 44_100, channels: int = 2) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    tone = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.repeat(tone[:, None], channels, axis=1).tobytes())
    return buf.getvalue()


def encoded_audio(path: Path, codec: str, rate: int, seconds: float = 1.0) -> bytes:
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        fmt = stream.codec_context.codec.audio_formats[0].name
        frame_size = stream.codec_context.frame_size or 1024
        t = np.arange(int(seconds * rate)) / rate
        tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        resampler = av.AudioResampler(format=fmt, layout="mono", rate=rate)
        for start in range(0, tone.shape[0], frame_size):
            chunk = tone[None, start : start + frame_size]
            frame = av.AudioFrame.from_ndarray(chunk, format="flt", layout="mono")
            frame.sample_rate = rate
            frame.pts = start
            frame.time_base = Fraction(1, rate)
            for f in resampler.resample(frame):
                out.mux(stream.encode(f))
        for f in resampler.resample(None):
            out.mux(stream.encode(f))
        out.mux(stream.encode(None))
    return path.read_bytes()


def encoded_video(
    path: Path, codec: str, seconds: float = 2.0, fps: int = 10, size: int = 16
) -> bytes:
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(int(seconds * fps)):
            rgb = np.full((size, size, 3), i * 10 % 256, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path.read_bytes()


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("media")


@pytest.fixture(scope="session")
def mp4_video(media_dir: Path) -> bytes:
    return encoded_video(media_dir / "clip.mp4", "mpeg4")


@pytest.fixture(scope="session")
def webm_video(media_dir: Path) -> bytes:
    return encoded_video(media_dir / "clip.webm", "libvpx")
