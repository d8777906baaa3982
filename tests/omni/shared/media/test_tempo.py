"""TimeStretch: the speech API's speed changes the length, not the pitch, fed in chunks as a
stream is; speeds beyond atempo's 0.5 to 2 run as a chain of stages."""

from __future__ import annotations

import numpy as np
import pytest

from omni.shared.media.tempo import TimeStretch

RATE = 16000


def tone(seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def stretched(speed: float, samples: np.ndarray, chunk: int = 1600) -> np.ndarray:
    stretch = TimeStretch(RATE, speed)
    pieces = [stretch.feed(samples[i : i + chunk]) for i in range(0, len(samples), chunk)]
    return np.concatenate([*pieces, stretch.finish()])


def peak_hz(samples: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / RATE)[int(np.argmax(spectrum))])


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 2.0, 4.0])
def test_the_length_divides_by_the_speed_and_the_pitch_stays(speed: float) -> None:
    source = tone(2.0)
    out = stretched(speed, source)
    assert out.dtype == np.float32
    assert len(out) == pytest.approx(len(source) / speed, rel=0.03)
    assert peak_hz(out) == pytest.approx(440.0, abs=10.0)


def test_chunking_does_not_change_the_result_length() -> None:
    source = tone(1.0)
    assert abs(len(stretched(2.0, source, chunk=160)) - len(stretched(2.0, source, chunk=16000))) <= 0.01 * len(source)


def test_empty_input_gives_nothing_and_a_speed_out_of_range_is_refused() -> None:
    stretch = TimeStretch(RATE, 1.25)
    assert stretch.feed(np.zeros(0, dtype=np.float32)).size == 0
    for speed in (0.2, 4.5):
        with pytest.raises(ValueError, match="between 0.25 and 4"):
            TimeStretch(RATE, speed)
