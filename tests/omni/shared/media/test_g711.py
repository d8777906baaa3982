"""G.711 against CPython's audioop (the Sun reference code, in C; Python 3.11 still ships it):
every int16 encodes and every byte decodes exactly as audioop does (worst difference: 0)."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

from omni.shared.media import g711

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop") if sys.version_info < (3, 13) else None

pytestmark = pytest.mark.skipif(audioop is None, reason="audioop left Python in 3.13")
EVERY_INT16 = np.arange(-32768, 32768, dtype=np.int16)
EVERY_BYTE = bytes(range(256))


@pytest.mark.parametrize(("law", "lin2", "to_lin"), [("pcmu", "lin2ulaw", "ulaw2lin"), ("pcma", "lin2alaw", "alaw2lin")])
def test_every_value_matches_audioop(law: str, lin2: str, to_lin: str) -> None:
    assert g711.encode(EVERY_INT16, law) == getattr(audioop, lin2)(EVERY_INT16.tobytes(), 2)
    expected = np.frombuffer(getattr(audioop, to_lin)(EVERY_BYTE, 2), dtype=np.int16)
    np.testing.assert_array_equal(g711.decode(EVERY_BYTE, law), expected)


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_a_round_trip_keeps_the_code(law: str) -> None:
    # decode then encode is the identity on codes (mu-law's two zeros aside: 0x7F and 0xFF)
    decoded = g711.decode(EVERY_BYTE, law)
    again = np.frombuffer(g711.encode(decoded, law), dtype=np.uint8)
    same = again == np.frombuffer(EVERY_BYTE, dtype=np.uint8)
    assert same.sum() >= 255
