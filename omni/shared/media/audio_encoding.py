"""Mono float32 PCM from the vocoder into the audio files OpenAI's APIs return, whole or streamed.

Chat's `audio.format` names wav, mp3, flac, opus, aac and pcm16; `/v1/audio/speech`'s
`response_format` names mp3, opus, aac, flac, wav and pcm. pcm and pcm16 are the same bytes:
raw 16-bit little-endian samples with no header. The API checks the name against the list of
its endpoint (CHAT_AUDIO_FORMATS, SPEECH_AUDIO_FORMATS) and answers a 400 naming its field;
here an unknown name is a plain ValueError, a caller's bug by then.

mp3, aac (ADTS), opus (Ogg) and flac go through FFmpeg (PyAV). Raw PCM16 and the 44-byte WAV
header are written here: FFmpeg's wav muxer could stream too, but it adds a LIST chunk naming
its version, and the header is a few lines. A streamed WAV carries 0xFFFFFFFF as its RIFF and
data sizes, as OpenAI's WAV does: the length is unknown when the header goes out, and players
read to the end. A whole WAV carries its true sizes (strict readers such as SDL need them).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

import av
import numpy as np
import numpy.typing as npt
from av.audio.stream import AudioStream

# What each API may ask for, in the order OpenAI documents them (for error messages).
CHAT_AUDIO_FORMATS = ("wav", "aac", "mp3", "flac", "opus", "pcm16")
SPEECH_AUDIO_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")


@dataclass(frozen=True, slots=True)
class _Spec:
    """How one format is made. container None: PCM16 written here, with a WAV header or none."""

    media_type: str  # the Content-Type OpenAI's speech API answers with
    container: str | None = None  # FFmpeg muxer name
    codec: str = ""
    sample_fmt: str = ""  # what the frames handed to the encoder hold
    bit_rate: int = 0  # 0: the codec has none (lossless)
    options: Mapping[str, str] = field(default_factory=dict)  # muxer options
    codec_options: Mapping[str, str] = field(default_factory=dict)


# Bit rates for 24 kHz mono speech. Muxer options: no ID3 tag (it only names FFmpeg's version);
# no 8 KiB FLAC padding block (kept for tag editing in place, useless here); Ogg pages of
# 60 ms instead of 1 s, so a stream sends a page every 3 Opus packets (the muxer also holds
# back the newest page, so bytes trail the audio by up to two pages; ~4 kbit/s of page
# headers). flush_packets: FFmpeg hands each packet's bytes to the sink as it is muxed.
# bitexact: no FFmpeg version string and a fixed Ogg serial, so equal input gives equal bytes.
# Opus at complexity 5 (of 10) costs about 40% of the default's CPU, for little loss in speech.
_MUXING = {"flush_packets": "1", "fflags": "+bitexact"}
_SPECS: dict[str, _Spec] = {
    "wav": _Spec("audio/wav"),
    "pcm": _Spec("audio/pcm"),
    "pcm16": _Spec("audio/pcm"),
    "mp3": _Spec("audio/mpeg", "mp3", "libmp3lame", "fltp", 64_000, {**_MUXING, "id3v2_version": "0"}),
    "aac": _Spec("audio/aac", "adts", "aac", "fltp", 64_000, _MUXING),
    "opus": _Spec("audio/opus", "ogg", "libopus", "flt", 32_000, {**_MUXING, "page_duration": "60000"},
                  {"compression_level": "5"}),
    "flac": _Spec("audio/flac", "flac", "flac", "s16", 0, {**_MUXING, "metadata_header_padding": "0"}),
}

AUDIO_FORMATS = frozenset(_SPECS)
MEDIA_TYPES: Mapping[str, str] = {name: spec.media_type for name, spec in _SPECS.items()}

_UNKNOWN_SIZE = 0xFFFFFFFF


def float_to_pcm16(samples: npt.NDArray[np.floating]) -> bytes:
    """Little-endian int16 bytes of `samples`.

    Clipped to [-1, 1], scaled by 32767 in float32 and rounded to the nearest integer, ties to
    even (np.rint): 1.0 and above -> 32767, -1.0 and below -> -32767 (the scale is symmetric,
    -32768 is never made), 0.3 / 32767 -> 0, 0.7 / 32767 -> 1. Decoders divide by 32768, so
    a round trip scales by 32767/32768 (-0.0003 dB).
    """
    return _to_int16(samples).astype("<i2", copy=False).tobytes()


def encode_audio(samples: npt.NDArray[np.floating], sample_rate: int, fmt: str) -> bytes:
    """A whole file of `fmt` holding mono `samples` at `sample_rate`.

    Unlike a stream, a whole WAV carries its true sizes, a whole MP3 a LAME/Xing frame (so
    decoders drop the encoder delay and padding: the decoded length is exact) and a whole FLAC
    its sample count and MD5, all written after the audio by seeking back.
    """
    spec = _spec(fmt)
    samples = _mono(samples)
    if spec.container is None:
        pcm = float_to_pcm16(samples)
        return _wav_header(sample_rate, len(pcm)) + pcm if fmt == "wav" else pcm
    buf = io.BytesIO()
    writer = _PyAVWriter(spec, sample_rate, buf)
    writer.write(samples)
    writer.close()
    return buf.getvalue()


class StreamingAudioEncoder:
    """Encodes audio as it arrives. The bytes of every feed() and of finish(), concatenated, are
    one valid file of `fmt`; each call returns what the container has ready (possibly b"").

    Encoders take fixed frames (MP3 576 samples at 24 kHz, AAC 1024, Opus 480, FLAC 2304):
    samples short of a frame wait for the next feed, the last partial frame goes at finish().
    Not thread-safe; each call encodes on the caller's thread (about a millisecond or less per
    second of audio, see the tests' module docstring).
    """

    def __init__(self, fmt: str, sample_rate: int) -> None:
        self._spec = _spec(fmt)
        self.fmt = fmt
        self.sample_rate = sample_rate
        self.media_type = self._spec.media_type
        self._finished = False
        self._sink: _ChunkSink | None = None
        self._writer: _PyAVWriter | None = None
        self._head = b""  # the WAV header, sent with the first bytes
        if self._spec.container is None:
            _check_rate(sample_rate)
            if fmt == "wav":
                self._head = _wav_header(sample_rate, None)
        else:
            self._sink = _ChunkSink()
            self._writer = _PyAVWriter(self._spec, sample_rate, self._sink)

    def feed(self, samples: npt.NDArray[np.floating]) -> bytes:
        if self._finished:
            raise RuntimeError("StreamingAudioEncoder.feed() after finish()")
        samples = _mono(samples)
        if self._writer is None:
            return self._take_head() + float_to_pcm16(samples)
        assert self._sink is not None
        self._writer.write(samples)
        return self._sink.take()

    def finish(self) -> bytes:
        if self._finished:
            raise RuntimeError("StreamingAudioEncoder.finish() called twice")
        self._finished = True
        if self._writer is None:
            return self._take_head()
        assert self._sink is not None
        self._writer.close()
        return self._sink.take()

    def close(self) -> None:
        """Drop the stream without finishing it (the client went away)."""
        self._finished = True
        if self._writer is not None:
            self._writer.abort()

    def _take_head(self) -> bytes:
        head, self._head = self._head, b""
        return head


class _Sink(Protocol):
    def write(self, data: bytes) -> int: ...


class _ChunkSink:
    """A write-only file for FFmpeg: no seek(), so muxers write as they go and never go back."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._chunks)
        self._chunks.clear()
        return out


class _PyAVWriter:
    """One FFmpeg muxer + encoder writing into `sink`, fed any number of samples at a time."""

    def __init__(self, spec: _Spec, sample_rate: int, sink: _Sink) -> None:
        _check_rate(sample_rate)
        codec = av.Codec(spec.codec, "w")
        if codec.audio_rates and sample_rate not in codec.audio_rates:
            raise ValueError(
                f"{spec.codec} cannot encode at {sample_rate} Hz; it takes "
                f"{', '.join(map(str, codec.audio_rates))}"
            )
        self._container = av.open(sink, "w", format=spec.container, container_options=dict(spec.options))
        stream = self._container.add_stream(spec.codec, rate=sample_rate, layout="mono")
        assert isinstance(stream, AudioStream)  # the codec names in _SPECS are audio encoders
        self._stream = stream
        ctx = stream.codec_context
        ctx.format = spec.sample_fmt
        ctx.flags |= av.codec.context.Flags.bitexact  # no FFmpeg version string in the stream
        if spec.bit_rate:
            ctx.bit_rate = spec.bit_rate
        ctx.options = dict(spec.codec_options)
        self._container.start_encoding()
        self._sample_fmt = spec.sample_fmt
        self._sample_rate = sample_rate
        self._time_base = Fraction(1, sample_rate)
        self._frame_size = ctx.frame_size
        self._int16 = spec.sample_fmt == "s16"
        self._pending: np.ndarray = np.empty(0, np.int16 if self._int16 else np.float32)
        self._num_encoded = 0  # samples handed to the encoder so far: the next frame's pts

    def write(self, samples: npt.NDArray[np.float32]) -> None:
        converted = _to_int16(samples) if self._int16 else np.clip(samples, -1.0, 1.0)
        pending = np.concatenate((self._pending, converted)) if self._pending.size else converted
        # pending: [0 .. end) whole frames go now, [end .. len) waits for more samples
        end = pending.shape[0] - pending.shape[0] % self._frame_size
        for start in range(0, end, self._frame_size):
            self._encode(pending[start : start + self._frame_size])
        self._pending = pending[end:].copy()

    def close(self) -> None:
        if self._pending.size:  # every encoder here takes a short last frame
            self._encode(self._pending)
            self._pending = self._pending[:0]
        self._container.mux(self._stream.encode(None))
        self._container.close()

    def abort(self) -> None:
        self._container.close()

    def _encode(self, chunk: np.ndarray) -> None:
        frame = av.AudioFrame.from_ndarray(chunk[None, :], format=self._sample_fmt, layout="mono")
        frame.sample_rate = self._sample_rate
        frame.time_base = self._time_base
        frame.pts = self._num_encoded
        self._num_encoded += chunk.shape[0]
        self._container.mux(self._stream.encode(frame))


def _spec(fmt: str) -> _Spec:
    spec = _SPECS.get(fmt)
    if spec is None:
        raise ValueError(f"Unknown audio format {fmt!r}; expected one of {', '.join(sorted(_SPECS))}.")
    return spec


def _check_rate(sample_rate: int) -> None:
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")


def _mono(samples: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    array = np.asarray(samples, dtype=np.float32)
    if array.ndim != 1:
        raise ValueError(f"expected mono samples of shape (n,), got shape {array.shape}")
    return array


def _to_int16(samples: npt.NDArray[np.floating]) -> npt.NDArray[np.int16]:
    scaled = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * np.float32(32767)
    return np.rint(scaled).astype(np.int16)


def _wav_header(sample_rate: int, num_data_bytes: int | None) -> bytes:
    """RIFF/WAVE header of 16-bit mono PCM; num_data_bytes None: unknown (a stream)."""
    data_size = _UNKNOWN_SIZE if num_data_bytes is None else num_data_bytes
    riff_size = _UNKNOWN_SIZE if num_data_bytes is None else 36 + num_data_bytes
    return (
        struct.pack("<4sI4s", b"RIFF", riff_size, b"WAVE")
        # fmt chunk: PCM (1), 1 channel, rate, byte rate, block align 2, 16 bits
        + struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + struct.pack("<4sI", b"data", data_size)
    )
