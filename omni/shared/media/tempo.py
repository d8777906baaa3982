"""Speech speed (the speech API's `speed`): a time stretch that keeps the pitch, FFmpeg's
atempo filter through PyAV, fed and drained chunk by chunk so a stream stays a stream.

atempo takes factors from 0.5 to 2 in every FFmpeg build; a speed outside that range runs as a
chain of them (0.25 = 0.5 x 0.5, 4 = 2 x 2).
"""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np


def _factors(speed: float) -> list[float]:
    factors = []
    while speed < 0.5:
        factors.append(0.5)
        speed /= 0.5
    while speed > 2.0:
        factors.append(2.0)
        speed /= 2.0
    return [*factors, speed]


class TimeStretch:
    """feed(float32 mono samples) -> the stretched samples ready so far; finish() -> the rest."""

    def __init__(self, sample_rate: int, speed: float) -> None:
        if not 0.25 <= speed <= 4.0:
            raise ValueError(f"speed must be between 0.25 and 4, got {speed}")
        self.sample_rate = sample_rate
        self._time_base = Fraction(1, sample_rate)
        self._graph = av.filter.Graph()
        self._source = self._graph.add_abuffer(
            format="flt", sample_rate=sample_rate, layout="mono", time_base=self._time_base
        )
        node = self._source
        for factor in _factors(speed):
            stage = self._graph.add("atempo", f"{factor:.6f}")
            node.link_to(stage)
            node = stage
        self._sink = self._graph.add("abuffersink")
        node.link_to(self._sink)
        self._graph.configure()
        self._pts = 0

    def feed(self, samples: np.ndarray) -> np.ndarray:
        if samples.size:
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, dtype=np.float32)[None, :], format="flt", layout="mono")
            frame.sample_rate = self.sample_rate
            frame.pts = self._pts
            frame.time_base = self._time_base
            self._pts += samples.size
            self._source.push(frame)
        return self._drain()

    def finish(self) -> np.ndarray:
        self._source.push(None)
        return self._drain()

    def _drain(self) -> np.ndarray:
        out = []
        while True:
            try:
                frame = self._sink.pull()
            except (BlockingIOError, av.error.EOFError):
                break
            assert isinstance(frame, av.AudioFrame)
            out.append(frame.to_ndarray().reshape(-1))
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, dtype=np.float32)
