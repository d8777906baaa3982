"""G.711 telephone audio (ITU-T G.711): mu-law (audio/pcmu) and A-law (audio/pcma), 8 bits a
sample at 8 kHz, to and from 16-bit PCM. The Realtime API's phone formats.

Each codec is a table: 256 entries to decode, 65,536 (every int16) to encode, computed once on
first use with the standard's segment arithmetic (the Sun reference code CPython's audioop
used; tests/omni/shared/media/test_g711.py checks every value against audioop).
"""

from __future__ import annotations

import functools

import numpy as np

SAMPLE_RATE = 8000
_BIAS = 0x84  # mu-law's bias, added to the magnitude before its segment is found
_SEG_END_MU = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])  # 14-bit magnitudes
_SEG_END_A = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])  # 13-bit magnitudes


@functools.cache
def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + _BIAS) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _BIAS - t, t - _BIAS).astype(np.int16)


@functools.cache
def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


@functools.cache
def _ulaw_encode_table() -> np.ndarray:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 2  # 14 bits
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(pcm), 8159) + (_BIAS >> 2)
    seg = np.searchsorted(_SEG_END_MU, mag)  # the first segment whose end holds it
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> (np.minimum(seg, 7) + 1)) & 0x0F))
    return ((code ^ mask) & 0xFF).astype(np.uint8)


@functools.cache
def _alaw_encode_table() -> np.ndarray:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 3  # 13 bits
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    mag = np.where(pcm >= 0, pcm, -pcm - 1)
    seg = np.searchsorted(_SEG_END_A, mag)
    low = np.where(seg < 2, mag >> 1, mag >> np.clip(seg, 0, 7)) & 0x0F
    code = np.where(seg >= 8, 0x7F, (seg << 4) | low)
    return ((code ^ mask) & 0xFF).astype(np.uint8)


def decode(data: bytes, law: str) -> np.ndarray:
    """G.711 bytes -> int16 samples; law is "pcmu" or "pcma"."""
    table = _ulaw_decode_table() if law == "pcmu" else _alaw_decode_table()
    return table[np.frombuffer(data, dtype=np.uint8)]


def encode(samples: np.ndarray, law: str) -> bytes:
    """int16 samples -> G.711 bytes; law is "pcmu" or "pcma"."""
    table = _ulaw_encode_table() if law == "pcmu" else _alaw_encode_table()
    return table[samples.astype(np.int32) + 32768].tobytes()
