from pathlib import Path

import numpy as np
import pytest

from omni.shared.media.audio import SAMPLE_RATE, decode_audio
from omni.shared.media.errors import MediaError
from omni.shared.media.limits import MediaLimits
from tests.omni.shared.media.conftest import encoded_audio, wav_bytes

PARAM = "messages[0].content[0].input_audio"
# Codec framing and resampler delay may add or drop a little: allow one 20 ms frame.
SLACK = SAMPLE_RATE // 50


def _error(data: bytes, limits: MediaLimits = MediaLimits(), fmt: str | None = None) -> MediaError:
    with pytest.raises(MediaError) as e:
        decode_audio(data, fmt, limits, PARAM)
    assert e.value.param == PARAM
    return e.value


def _check_tone(samples: np.ndarray, seconds: float) -> None:
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(samples.shape[0] - seconds * SAMPLE_RATE) <= SLACK
    assert 0.4 < float(np.abs(samples).max()) < 0.6  # the 0.5-amplitude tone survived


def test_wav_stereo_44k_to_mono_16k() -> None:
    _check_tone(decode_audio(wav_bytes(1.0, 44_100, 2), "wav", MediaLimits(), PARAM), 1.0)


def test_wav_8k_upsamples() -> None:
    _check_tone(decode_audio(wav_bytes(0.5, 8_000, 1), None, MediaLimits(), PARAM), 0.5)


@pytest.mark.parametrize(
    ("name", "codec", "rate", "fmt"),
    [("a.flac", "flac", 44_100, "flac"), ("a.ogg", "libopus", 48_000, "ogg"),
     ("a.mp3", "libmp3lame", 44_100, "mp3"), ("a.webm", "libopus", 48_000, "webm")],
)
def test_compressed_formats(tmp_path: Path, name: str, codec: str, rate: int, fmt: str) -> None:
    data = encoded_audio(tmp_path / name, codec, rate)
    _check_tone(decode_audio(data, fmt, MediaLimits(), PARAM), 1.0)


def test_duration_limit() -> None:
    error = _error(wav_bytes(1.0, 16_000, 1), MediaLimits(max_audio_seconds=0.5))
    assert "max_audio_seconds" in error.message
    decode_audio(wav_bytes(0.5, 16_000, 1), None, MediaLimits(max_audio_seconds=0.5), PARAM)


def test_duration_limit_from_header(tmp_path: Path) -> None:
    # 3 s of FLAC against a 1 s limit: the header duration refuses it (slack is 1 s).
    data = encoded_audio(tmp_path / "long.flac", "flac", 16_000, seconds=3.0)
    assert "max_audio_seconds" in _error(data, MediaLimits(max_audio_seconds=1.0)).message


def test_byte_limit() -> None:
    data = wav_bytes(0.1)
    assert "max_bytes" in _error(data, MediaLimits(max_bytes=len(data) - 1)).message


def test_unknown_format_name() -> None:
    assert "Unsupported audio format" in _error(wav_bytes(0.1), fmt="midi").message


@pytest.mark.parametrize(
    "data",
    [b"", b"garbage" * 100, wav_bytes(0.1)[:30], b"RIFF\x00\x00\x00\x00WAVEfmt " + b"\xff" * 64],
)
def test_corrupt_audio(data: bytes) -> None:
    assert _error(data).message.startswith(f"could not decode audio in {PARAM}")


def test_video_without_audio_is_400(mp4_video: bytes) -> None:
    assert _error(mp4_video).message.startswith("could not decode audio")


def test_media_duration_is_the_containers_length() -> None:
    """Against the stdlib wave module's frame count (worst difference: none beyond float)."""
    import io as _io
    import wave

    from omni.shared.media.audio import media_duration_s

    buf = _io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 20_000)  # 1.25 s
    with wave.open(_io.BytesIO(buf.getvalue())) as r:
        expected = r.getnframes() / r.getframerate()
    assert media_duration_s(buf.getvalue(), "audio") == pytest.approx(expected, abs=1e-9)
    assert media_duration_s(b"not a media file", "audio") is None
