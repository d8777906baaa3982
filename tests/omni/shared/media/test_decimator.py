"""The streaming decimator against scipy: its taps are scipy.signal.firwin's (Hamming, scaled
to unit gain at DC), and a signal pushed in random pieces gives lfilter over the whole signal,
every factor-th sample (worst difference below 1e-6, float32 output)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import signal

from omni.shared.media.decimator import NUM_TAPS, Decimator, lowpass_taps


def test_taps_are_firwins() -> None:
    np.testing.assert_allclose(lowpass_taps(NUM_TAPS, 1 / 3), signal.firwin(NUM_TAPS, 1 / 3, window="hamming"), atol=1e-12)


@pytest.mark.parametrize("factor", [2, 3])
def test_pieces_give_the_whole_signals_output(factor: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4801).astype(np.float32)
    expected = signal.lfilter(signal.firwin(NUM_TAPS, 1 / factor, window="hamming"), 1.0, x)[::factor]
    d = Decimator(factor)
    cuts = np.sort(rng.choice(len(x), size=30, replace=False))
    out = np.concatenate([d.push(p) for p in np.split(x, cuts)])
    assert len(out) == len(expected)
    assert float(np.max(np.abs(out - expected))) < 1e-6


def test_a_tone_above_the_new_nyquist_is_removed() -> None:
    t = np.arange(24000) / 24000
    low, high = np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 6000 * t)
    out = Decimator(3).push((low + high).astype(np.float32))[200:]  # past the filter's start
    expected = np.sin(2 * np.pi * 440 * np.arange(8000) / 8000 - 2 * np.pi * 440 * 31 / 24000)[200:]
    assert float(np.max(np.abs(out - expected))) < 0.03
