"""Large joins that leave the GIL to other threads while they copy.

`"".join(pieces)` of 60 MB is one C call that holds the GIL for its whole copy: about 55 ms on
a small box, most of it faulting in the new string's pages. Run in a worker thread, it still
stops the event loop for that long. join_str and join_bytes allocate the result through the C
API without filling it, then copy each piece into it with ctypes.memmove, a foreign call that
runs with the GIL released: the copy and its page faults happen while the loop runs.

    pieces   "abc..." (1 MB)  "def..." (1 MB)  ...
    result   PyUnicode_New(total, maxchar)     uninitialized, not yet seen by anyone
             memmove(data(result) + offset, data(piece), len(piece) * kind)   GIL released

A str's characters are stored at one width for the whole string (PEP 393: 1, 2 or 4 bytes);
a piece narrower than the result is widened a slice at a time (slice + one wide character,
a short copy under the GIL) and copied without that last character.

Only CPython's compact strings are copied this way (every str and bytes CPython makes); the
layout is read from the interpreter at import and checked on known strings, and anything
unexpected, like a small join, takes the plain join. A piece must not change while it is
copied: str and bytes cannot, and a bytearray must not be resized meanwhile.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence

# Below this many characters (or bytes) a plain join is short enough.
LARGE = 1 << 20
# Characters of a narrower piece widened under the GIL per step.
_WIDEN_SLICE = 1 << 18

_MAXCHAR = {1: 0xFF, 2: 0xFFFF, 4: 0x10FFFF}
_WIDE = {2: "\u0100", 4: "\U00010000"}  # one character that makes a string this wide


class _Layout:
    """Where CPython keeps a compact str's and a bytes object's data, and how wide a str is."""

    def __init__(self) -> None:
        api = ctypes.pythonapi
        self.new_str = api.PyUnicode_New
        self.new_str.restype = ctypes.py_object  # ctypes takes over the new reference
        self.new_str.argtypes = [ctypes.c_ssize_t, ctypes.c_uint32]
        self.new_bytes = api.PyBytes_FromStringAndSize
        self.new_bytes.restype = ctypes.py_object
        self.new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
        # sizeof(PyASCIIObject) and sizeof(PyCompactUnicodeObject): a fresh string has no
        # cached UTF-8 copy, so its size is its header and its characters (with a NUL).
        self.ascii_head = sys.getsizeof("a" * 7) - 8
        self.compact_head = sys.getsizeof("\xe9" * 7) - 8
        self.bytes_head = sys.getsizeof(b"a" * 7) - 8
        # PyASCIIObject.state follows ob_refcnt, ob_type, length and hash.
        self.state_offset = 4 * ctypes.sizeof(ctypes.c_ssize_t)

    def kind(self, s: str) -> int:
        """Bytes per character: 1, 2 or 4 (from the state bit field: interned:2, kind:3)."""
        return (ctypes.c_uint32.from_address(id(s) + self.state_offset).value >> 2) & 7

    def compact(self, s: str) -> bool:
        return bool((ctypes.c_uint32.from_address(id(s) + self.state_offset).value >> 5) & 1)

    def str_data(self, s: str) -> int:
        return id(s) + (self.ascii_head if s.isascii() else self.compact_head)

    def bytes_data(self, b: bytes) -> int:
        return id(b) + self.bytes_head


def _load_layout() -> _Layout | None:
    if sys.implementation.name != "cpython":
        return None
    try:
        layout = _Layout()
    except (AttributeError, OSError):
        return None
    samples = {"ab" * 8: 1, "\xe9" * 8: 1, "\u20ac" * 8: 2, "\U0001f600" * 8: 4}
    if any(layout.kind(s) != k or not layout.compact(s) for s, k in samples.items()):
        return None
    return layout


_LAYOUT = _load_layout()


def join_str(pieces: Sequence[str]) -> str:
    """"".join(pieces), its copy made with the GIL released when it is large."""
    layout = _LAYOUT
    if layout is None or not isinstance(pieces, list | tuple):
        return "".join(pieces)
    if any(type(p) is not str for p in pieces):
        return "".join(pieces)  # its errors and its subclasses' handling, exactly
    total = sum(map(len, pieces))
    if total < LARGE or len(pieces) < 2 or not all(map(layout.compact, pieces)):
        return "".join(pieces)
    kinds = [layout.kind(p) for p in pieces]
    kind = max(kinds)
    ascii = all(p.isascii() for p in pieces)
    out = layout.new_str(total, 0x7F if ascii else _MAXCHAR[kind])
    at = layout.str_data(out)
    for p, k in zip(pieces, kinds):
        if k == kind:
            ctypes.memmove(at, layout.str_data(p), len(p) * kind)
            at += len(p) * kind
            continue
        for start in range(0, len(p), _WIDEN_SLICE):
            wide = p[start : start + _WIDEN_SLICE] + _WIDE[kind]
            n = (len(wide) - 1) * kind
            ctypes.memmove(at, layout.str_data(wide), n)
            at += n
    return out


def join_bytes(pieces: Sequence[bytes]) -> bytes:
    """b"".join(pieces) of bytes objects, its copy made with the GIL released when it is large."""
    layout = _LAYOUT
    if layout is None or not isinstance(pieces, list | tuple) or any(type(p) is not bytes for p in pieces):
        return b"".join(pieces)
    total = sum(map(len, pieces))
    if total < LARGE or len(pieces) < 2:
        return b"".join(pieces)
    out = layout.new_bytes(None, total)
    at = layout.bytes_data(out)
    for p in pieces:
        ctypes.memmove(at, layout.bytes_data(p), len(p))
        at += len(p)
    return out
