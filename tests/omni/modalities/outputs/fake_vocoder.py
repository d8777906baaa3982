"""A fake vocoder for the audio output's tests: AudioDecoderEngine's face to ModelAudio (its
ready message, the streams it opens) and each stream's chunks as sent; a chunk's samples are
its units as float32, so a test knows every sample."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from omni.shared import protocol

VOICES = ["mhwj", "fkms", "nara", "jinho"]


@dataclass
class FakeSink:
    """One vocoder stream: each chunk's units in order; the samples are the units as float32."""

    voice: int | None = None
    chunks: list[tuple[list[int], bool]] = field(default_factory=list)
    closed: bool = False

    async def decode(self, units: list[int], *, last: bool = False) -> bytes:
        self.chunks.append((list(units), last))
        return np.asarray(units, dtype="<f4").tobytes()

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeDecoder:
    """AudioDecoderEngine's face to ModelAudio: its ready message, and streams it opens."""

    info: protocol.AudioDecoderReady | None = field(
        default_factory=lambda: protocol.AudioDecoderReady(0, "cpu", 16000, 640, 100, list(VOICES), False)
    )
    ready: bool = True
    opened: list[tuple[int, bytes | None]] = field(default_factory=list)
    sinks: list[FakeSink] = field(default_factory=list)
    orders: list[tuple[int, bool]] = field(default_factory=list)  # each stream's (priority, live)

    def open_stream(
        self, speaker: int = 0, embedding: bytes | None = None, *, priority: int = 0, live: bool = False
    ) -> FakeSink:
        self.opened.append((speaker, embedding))
        self.orders.append((priority, live))
        self.sinks.append(FakeSink(speaker))
        return self.sinks[-1]
