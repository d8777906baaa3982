"""Every output format, whole and streamed, decoded back with PyAV and checked for the tone.

Decoded rates: 24 kHz for all but opus, which FFmpeg's Opus decoder always gives at 48 kHz
(Opus codes at 48 kHz inside; the 24 kHz input rate is only recorded in the Ogg header).
"""

import io
import struct

import av
import numpy as np
import pytest

from omni.shared.media.audio_encoding import (
    AUDIO_FORMATS,
    CHAT_AUDIO_FORMATS,
    MEDIA_TYPES,
    SPEECH_AUDIO_FORMATS,
    StreamingAudioEncoder,
    encode_audio,
    float_to_pcm16,
)

RATE = 24_000
SECONDS = 1.3
TONE_HZ = 440
TONE = (0.5 * np.sin(2 * np.pi * TONE_HZ * np.arange(int(SECONDS * RATE)) / RATE)).astype(np.float32)
CHUNKS = (1, 480, 7000, 2400)  # then the rest: sizes that straddle every codec's frame

# (decoded rate, most extra samples a whole file decodes to, most extra for a stream), in
# samples at the decoded rate. No format may decode to fewer samples than it was given.
# mp3: a whole file's LAME frame tells the decoder to drop the encoder delay and the padding;
#   a stream has no such frame (it is written at the end by seeking back), so it decodes with
#   LAME's delay (576 + 529 samples) and the last 576-sample frame's padding in front/behind.
# aac: ADTS cannot say how much to drop: 1024 samples of priming plus the last frame's padding.
# opus: the Ogg header's pre-skip and the last page's granule position trim both ends; one
#   20 ms frame of slack. Lossless formats decode exactly.
DURATIONS = {
    "wav": (RATE, 0, 0),
    "flac": (RATE, 0, 0),
    "mp3": (RATE, 576, 576 + 529 + 576),
    "aac": (RATE, 1024 + 1024, 1024 + 1024),
    "opus": (48_000, 960, 960),
}
LOSSLESS = ("wav", "flac")
CONTAINERS = tuple(DURATIONS)
EXPECTED_PCM16 = np.frombuffer(float_to_pcm16(TONE), dtype="<i2")


def _streamed(fmt: str, samples: np.ndarray = TONE) -> list[bytes]:
    """The bytes of each feed() in CHUNKS and of the rest, then finish()'s."""
    encoder = StreamingAudioEncoder(fmt, RATE)
    parts, start = [], 0
    for size in (*CHUNKS, samples.shape[0]):
        parts.append(encoder.feed(samples[start : start + size]))
        start += size
    parts.append(encoder.finish())
    return parts


def _decode(data: bytes) -> tuple[np.ndarray, int]:
    """Mono samples as the decoder gives them (int16 for PCM and FLAC, float32 otherwise)."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [frame.to_ndarray() for frame in container.decode(stream)]
        assert stream.codec_context.layout.nb_channels == 1
        rate = stream.codec_context.sample_rate
    samples = np.concatenate(frames, axis=1)
    assert samples.shape[0] == 1
    return samples[0], rate


def _dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples.astype(np.float64) * np.hanning(samples.shape[0])))
    return float(np.argmax(spectrum)) * rate / samples.shape[0]


def _check_tone(data: bytes, fmt: str, max_extra: int) -> np.ndarray:
    samples, rate = _decode(data)
    expected_rate = DURATIONS[fmt][0]
    assert rate == expected_rate
    extra = samples.shape[0] - round(SECONDS * expected_rate)
    assert 0 <= extra <= max_extra, f"{fmt}: {extra} extra samples"
    # bins are 1/1.3 s = 0.77 Hz wide; a tone that survived peaks in the bin of 440 Hz
    assert abs(_dominant_hz(samples, rate) - TONE_HZ) < 1.0
    return samples


@pytest.mark.parametrize("fmt", CONTAINERS)
def test_whole_file_decodes_to_the_tone(fmt: str) -> None:
    samples = _check_tone(encode_audio(TONE, RATE, fmt), fmt, DURATIONS[fmt][1])
    if fmt in LOSSLESS:
        assert samples.dtype == np.int16
        np.testing.assert_array_equal(samples, EXPECTED_PCM16)


@pytest.mark.parametrize("fmt", CONTAINERS)
def test_stream_decodes_to_the_tone(fmt: str) -> None:
    parts = _streamed(fmt)
    samples = _check_tone(b"".join(parts), fmt, DURATIONS[fmt][2])
    if fmt in LOSSLESS:
        np.testing.assert_array_equal(samples, EXPECTED_PCM16)
    # It streams: the first three feeds (0.31 s fed) already decode to sound, and finish()
    # holds only the tail that the encoder and muxer were waiting on.
    early, _ = _decode(b"".join(parts[:3]))
    assert early.shape[0] >= 0.1 * DURATIONS[fmt][0]
    assert len(parts[-1]) < 0.2 * len(b"".join(parts))


@pytest.mark.parametrize("fmt", ["aac", "opus"])
def test_stream_equals_whole_file_where_nothing_is_written_back(fmt: str) -> None:
    # ADTS and Ogg never seek back, and bitexact fixes the Ogg serial: the same bytes.
    assert b"".join(_streamed(fmt)) == encode_audio(TONE, RATE, fmt)


@pytest.mark.parametrize("fmt", ["pcm", "pcm16"])
def test_pcm_is_the_pcm16_bytes_whole_and_streamed(fmt: str) -> None:
    whole = encode_audio(TONE, RATE, fmt)
    assert whole == float_to_pcm16(TONE)
    parts = _streamed(fmt)
    assert b"".join(parts) == whole
    assert [len(p) for p in parts[:4]] == [2 * n for n in CHUNKS]  # nothing held back
    assert parts[-1] == b""


def test_wav_whole_has_sizes_streamed_has_unknown_sizes() -> None:
    whole = encode_audio(TONE, RATE, "wav")
    streamed = b"".join(_streamed("wav"))
    pcm = float_to_pcm16(TONE)
    assert len(whole) == len(streamed) == 44 + len(pcm)
    assert whole[44:] == streamed[44:] == pcm
    assert struct.unpack("<I", whole[4:8])[0] == 36 + len(pcm)
    assert struct.unpack("<I", whole[40:44])[0] == len(pcm)
    assert streamed[4:8] == streamed[40:44] == b"\xff\xff\xff\xff"
    # apart from the two sizes, the headers are the same
    assert whole[:4] + whole[8:40] == streamed[:4] + streamed[8:40]
    assert whole[:4] == b"RIFF" and whole[8:16] == b"WAVEfmt " and whole[36:40] == b"data"


def test_wav_header_fields() -> None:
    fmt_chunk = encode_audio(TONE[:10], RATE, "wav")[12:36]
    # "fmt ", 16 bytes: PCM, mono, 24000 Hz, 48000 bytes/s, 2-byte frames, 16 bits
    assert struct.unpack("<4sIHHIIHH", fmt_chunk) == (b"fmt ", 16, 1, 1, RATE, 2 * RATE, 2, 16)


def test_wav_feed_before_any_audio_and_empty_stream() -> None:
    encoder = StreamingAudioEncoder("wav", RATE)
    assert len(encoder.feed(np.zeros(0, np.float32))) == 44  # the header goes out at once
    assert encoder.feed(np.zeros(0, np.float32)) == b""
    assert encoder.finish() == b""
    only_header = StreamingAudioEncoder("wav", RATE).finish()
    assert len(only_header) == 44 and only_header[:4] == b"RIFF"


def test_float_to_pcm16_clips() -> None:
    pcm = float_to_pcm16(np.array([2.0, -2.0, 1.0, -1.0, 0.0, np.inf, -np.inf], np.float32))
    assert np.frombuffer(pcm, "<i2").tolist() == [32767, -32767, 32767, -32767, 0, 32767, -32767]


def test_float_to_pcm16_rounds_to_nearest() -> None:
    n = np.arange(-32767, 32768, 97, dtype=np.float64)
    for offset, expected in ((0.0, n), (0.3, n), (-0.3, n), (0.7, n + 1), (-0.7, n - 1)):
        samples = ((n + offset) / 32767).astype(np.float32)
        got = np.frombuffer(float_to_pcm16(samples), "<i2")
        np.testing.assert_array_equal(got, np.clip(expected, -32767, 32767))


def test_float_to_pcm16_is_little_endian_int16() -> None:
    assert float_to_pcm16(np.array([1 / 32767, -1 / 32767, 256 / 32767], np.float32)) == (
        b"\x01\x00\xff\xff\x00\x01"
    )


def test_formats_and_media_types() -> None:
    assert set(CHAT_AUDIO_FORMATS) | set(SPEECH_AUDIO_FORMATS) == AUDIO_FORMATS
    assert MEDIA_TYPES == {
        "wav": "audio/wav", "mp3": "audio/mpeg", "flac": "audio/flac", "opus": "audio/opus",
        "aac": "audio/aac", "pcm": "audio/pcm", "pcm16": "audio/pcm",
    }
    assert StreamingAudioEncoder("mp3", RATE).media_type == "audio/mpeg"


def test_unknown_format_names_the_known_ones() -> None:
    for call in (lambda: encode_audio(TONE, RATE, "ogg"), lambda: StreamingAudioEncoder("ogg", RATE)):
        with pytest.raises(ValueError) as e:
            call()
        assert "'ogg'" in str(e.value)
        assert all(name in str(e.value) for name in AUDIO_FORMATS)


def test_bad_input_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="mono"):
        encode_audio(np.zeros((2, 10), np.float32), RATE, "flac")
    with pytest.raises(ValueError, match="44100 Hz"):  # Opus has no 44.1 kHz mode
        StreamingAudioEncoder("opus", 44_100)


def test_feed_after_finish_is_refused() -> None:
    encoder = StreamingAudioEncoder("flac", RATE)
    encoder.finish()
    with pytest.raises(RuntimeError):
        encoder.feed(TONE)


def test_close_drops_an_unfinished_stream() -> None:
    encoder = StreamingAudioEncoder("opus", RATE)
    encoder.feed(TONE)
    encoder.close()
    with pytest.raises(RuntimeError):
        encoder.feed(TONE)
