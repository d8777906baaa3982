"""join_str and join_bytes: equal to the plain joins for every width and mix of widths, and
their copy lets other threads run (the plain join's does not)."""

from __future__ import annotations

import ctypes
import sys
import threading

import pytest

from omni.shared import gil_free
from omni.shared.gil_free import LARGE, join_bytes, join_str

ASCII = "All work and no play makes Jack a dull boy. "
WIDTHS = {"ascii": "a", "latin-1": "\xe9", "ucs-2": "\u20ac", "ucs-4": "\U0001f600"}


def _piece(ch: str, n: int) -> str:
    return (ASCII + ch) * (n // (len(ASCII) + 1))


def test_the_interpreter_layout_is_understood() -> None:
    # The fast path is what the tests below check; on CPython it must be on.
    assert (gil_free._LAYOUT is not None) == (sys.implementation.name == "cpython")


@pytest.mark.parametrize("first", list(WIDTHS))
@pytest.mark.parametrize("second", list(WIDTHS))
def test_join_str_equals_the_plain_join_for_each_mix_of_widths(first: str, second: str) -> None:
    pieces = [_piece(WIDTHS[first], LARGE // 2 + 7), _piece(WIDTHS[second], LARGE // 2 + 11), "tail"]
    joined = join_str(pieces)
    assert type(joined) is str
    assert joined == "".join(pieces)
    assert hash(joined) == hash("".join(pieces))
    assert joined.isascii() == all(p.isascii() for p in pieces)


def test_a_narrow_piece_longer_than_a_widening_slice_is_widened_whole() -> None:
    pieces = [ASCII * (3 * gil_free._WIDEN_SLICE // len(ASCII) + 5), "\U0001f600" * 3]
    assert join_str(pieces) == "".join(pieces)


def test_small_single_and_odd_inputs_take_the_plain_join() -> None:
    big = _piece("a", 2 * LARGE)
    assert join_str([big]) is big
    assert join_str(["a", "b"]) == "ab"
    assert join_str([]) == ""
    assert join_str(iter([big, "x"])) == big + "x"  # not a list: the plain join
    with pytest.raises(TypeError):
        join_str([big, 3])  # type: ignore[list-item]


def test_the_result_is_owned_once() -> None:
    joined = join_str([_piece("a", LARGE), _piece("\xe9", LARGE)])
    assert sys.getrefcount(joined) == 2  # the name and getrefcount's argument: no leaked reference


def test_join_bytes_equals_the_plain_join() -> None:
    pieces = [bytes(range(256)) * (LARGE // 256 + 3), b"", b"xyz" * 1000]
    joined = join_bytes(pieces)
    assert type(joined) is bytes and joined == b"".join(pieces)
    assert sys.getrefcount(joined) == 2
    assert join_bytes([b"a", bytearray(b"b")]) == b"ab"  # not all bytes: the plain join


def test_the_plain_join_holds_the_gil_throughout() -> None:
    """The contrast: a thread waiting for the GIL all along never runs during "".join. The join
    is one C call, which never looks at the interpreter's switch requests, so this holds however
    long the copy takes (no timing). That another thread does run during join_str's copy, given
    a free core, is bench/gil_free_join.py's to show: how soon the OS runs it is the machine's."""
    go = threading.Event()
    state = {"joining": True, "ran_during": False}

    def other() -> None:
        go.wait()
        state["ran_during"] = state["joining"]

    pieces = [_piece("a", 1 << 20) for _ in range(8)]
    thread = threading.Thread(target=other)
    thread.start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e6)  # never asked to hand the GIL over between these lines either
    try:
        go.set()  # the other thread now wants the GIL, which this one holds
        "".join(pieces)
        state["joining"] = False
    finally:
        sys.setswitchinterval(interval)
    thread.join()
    assert state["ran_during"] is False


@pytest.mark.parametrize("widths", [("ascii", "ascii"), ("ascii", "ucs-4")])
def test_the_copy_is_a_foreign_call_without_the_gil(widths: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every byte of the result is copied by ctypes.memmove, and memmove is a CFUNCTYPE foreign
    function: ctypes releases the GIL around such a call (a PYFUNCTYPE one would keep it)."""
    assert type(ctypes.memmove)._flags_ & ctypes._FUNCFLAG_PYTHONAPI == 0  # type: ignore[attr-defined]
    real = ctypes.memmove
    copied: list[int] = []

    def counting(dst: int, src: int, n: int) -> int:
        copied.append(n)
        return real(dst, src, n)

    monkeypatch.setattr(ctypes, "memmove", counting)
    pieces = [_piece(WIDTHS[w], LARGE) for w in widths]
    joined = join_str(pieces)
    assert joined == "".join(pieces)
    width = 4 if "ucs-4" in widths else 1
    assert sum(copied) == len(joined) * width  # no byte copied under the GIL by another path
    copied.clear()
    data = [b"x" * (LARGE // 2 + 5), b"y" * (LARGE // 2 + 7)]
    assert join_bytes(data) == b"".join(data) and sum(copied) == sum(map(len, data))
