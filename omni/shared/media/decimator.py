"""Streaming integer-factor downsampling: a windowed-sinc low-pass FIR (Hamming window, unit
gain at DC, cut at the new Nyquist frequency) then every factor-th sample, fed in pieces of any
size with the same output as the whole signal at once. The Realtime API's 24 kHz audio goes to
8 kHz this way (the voice activity model's rate, and G.711's).
"""

from __future__ import annotations

import numpy as np

NUM_TAPS = 63  # odd: the filter is symmetric about its middle tap (a delay of 31 input samples)


def lowpass_taps(num_taps: int, cutoff: float) -> np.ndarray:
    """cutoff: a fraction of the Nyquist frequency (0 < cutoff < 1)."""
    n = np.arange(num_taps) - (num_taps - 1) / 2
    taps = cutoff * np.sinc(cutoff * n) * np.hamming(num_taps)
    return (taps / taps.sum()).astype(np.float64)


class Decimator:
    """float32 samples at rate r -> at rate r / factor. The first output sample is the filter's
    response to input sample 0 (zeros before it), so output i stands at input factor * i."""

    def __init__(self, factor: int, num_taps: int = NUM_TAPS) -> None:
        self.factor = factor
        self.taps = lowpass_taps(num_taps, 1.0 / factor)
        self._history = np.zeros(num_taps - 1, dtype=np.float64)  # the last inputs, for the next piece
        self._phase = 0  # inputs to skip before the next kept one

    def push(self, samples: np.ndarray) -> np.ndarray:
        x = np.concatenate([self._history, samples.astype(np.float64)])
        filtered = np.convolve(x, self.taps, mode="valid")  # one output per new input sample
        kept = filtered[self._phase :: self.factor]
        self._phase = (self._phase - len(samples)) % self.factor
        self._history = x[len(x) - len(self._history) :]
        return kept.astype(np.float32)
