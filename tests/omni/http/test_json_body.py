"""decode_json equals orjson.loads on every document and refuses what it refuses, with windows
small enough that every array, object and string is cut many times: runs of elements at every
comma, long strings inside UTF-8 sequences, escapes, surrogate pairs and backslash runs."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni.http import json_body
from omni.http.json_body import MAX_DEPTH, WINDOW, decode_json

SMALL = 32  # the smallest window: cuts land everywhere

# --- documents as text: duplicate keys, whitespace, escapes, every kind of number ----------------

# Characters that make cuts hard: multi-byte UTF-8, astral (a surrogate pair when escaped),
# quotes and backslashes (escaped), control characters (\n, \u0001), and JSON's own punctuation,
# which a cut must not take for structure inside a string.
_TRICKY = st.sampled_from(
    ["\\", '"', "\n", "\x01", "é", "한", "\U0001f600", "\ud7ff", "a", "u", "D8", ",", "[", "]", "{", "}", ":", "/"]
)
_TEXT = st.lists(st.one_of(_TRICKY, st.text(max_size=3)), max_size=24).map("".join)
_WS = st.sampled_from(["", "", " ", "\n", "\t", "\r\n  "])


@st.composite
def _string(draw: st.DrawFn) -> str:
    text = json.dumps(draw(_TEXT), ensure_ascii=draw(st.booleans()))  # ensure_ascii: \uXXXX, pairs
    return text.replace("/", "\\/") if draw(st.booleans()) else text


_NUMBER = st.one_of(
    st.integers(-(2**65), 2**65).map(str),  # past 64 bits orjson makes a float
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.tuples(st.integers(-(10**20), 10**20), st.integers(0, 10**9), st.integers(-400, 400)).map(
        lambda t: f"{t[0]}.{t[1]}e{t[2]:+}"  # exponents past a double's range: refused
    ),
)
_SCALAR = st.one_of(st.sampled_from(["null", "true", "false"]), _NUMBER, _string())
_KEY = st.one_of(st.sampled_from(['"a"', '"b"', '"a"']), _string())  # duplicates, often


def _containers(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    # one piece of whitespace per container, around each of its punctuation marks
    arrays = st.tuples(_WS, st.lists(inner, max_size=6)).map(lambda t: _join("[", t[0], t[1], "]"))
    members = st.lists(st.tuples(_KEY, inner), max_size=6)
    objects = st.tuples(_WS, members).map(lambda t: _join("{", t[0], [k + t[0] + ":" + t[0] + v for k, v in t[1]], "}"))
    return st.one_of(arrays, objects)


def _join(opener: str, ws: str, items: list[str], closer: str) -> str:
    return opener + ws + (ws + "," + ws).join(items) + ws + closer


_DOCUMENT = st.tuples(_WS, st.recursive(_SCALAR, _containers, max_leaves=16), _WS).map(lambda t: "".join(t).encode())
_WINDOW = st.integers(SMALL, 64)


def _same(a: Any, b: Any) -> bool:
    """a == b, and the same types (1 is not 1.0, -0.0 is not 0.0) and key order, at any depth."""
    pairs = [(a, b)]
    while pairs:
        x, y = pairs.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, list):
            if len(x) != len(y):
                return False
            pairs += zip(x, y)
        elif isinstance(x, dict):
            if list(x) != list(y):
                return False
            pairs += zip(x.values(), y.values())
        elif repr(x) != repr(y):
            return False
    return True


def _assert_as_orjson(doc: bytes, window: int) -> None:
    try:
        want = orjson.loads(doc)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            decode_json(bytearray(doc), window=window)
        return
    assert _same(decode_json(bytearray(doc), window=window), want)


# Guesses at a cut: the decoder's own, none (the exact scan finds every cut), or any comma at
# all (orjson's check of a run must refuse every wrong one).
def _random_commas(seed: int) -> Callable[..., int | None]:
    rnd = random.Random(seed)

    def guess(self: Any, start: int, stop: int) -> int | None:
        commas = [i for i in range(start, stop) if self.raw[i] == ord(",")]
        return rnd.choice(commas) if commas and rnd.random() < 0.8 else None

    return guess


_GUESSES = st.one_of(st.none(), st.just(lambda self, start, stop: None), st.integers(0, 2**32).map(_random_commas))
# Bytes the exact scan covers a call: tiny ones end its steps inside strings, numbers, escapes.
_SCAN_STEPS = st.sampled_from([4, 16, json_body._SCAN_STEP])


@settings(max_examples=100, deadline=None)
@given(_DOCUMENT, _WINDOW, _GUESSES, _SCAN_STEPS)
def test_equals_orjson_for_any_document(
    doc: bytes, window: int, guess: Callable[..., int | None] | None, scan_step: int
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        if guess is not None:
            patch.setattr(json_body._Decoder, "_guess", guess)
        patch.setattr(json_body, "_SCAN_STEP", scan_step)
        _assert_as_orjson(doc, window)


_STRAY = st.sampled_from([bytes([b]) for b in b'"\\,:[]{} x0-.e\n\x00\x80\xff'])


@settings(max_examples=100, deadline=None)
@given(_DOCUMENT, _WINDOW, st.data())
def test_a_corrupted_document_is_refused_as_orjson_refuses(doc: bytes, window: int, data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(doc)))
    match data.draw(st.sampled_from(["truncate", "insert", "delete"])):
        case "truncate":
            doc = doc[:at]
        case "insert":
            doc = doc[:at] + data.draw(_STRAY) + doc[at:]
        case "delete":
            doc = doc[:at] + doc[at + 1 :]
    _assert_as_orjson(doc, window)


_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10, 10), _TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=50, deadline=None)
@given(_VALUES, st.booleans())
def test_equals_the_value_dumped(value: Any, ascii_escapes: bool) -> None:
    doc = json.dumps(value, ensure_ascii=ascii_escapes).encode()
    assert decode_json(bytearray(doc), window=SMALL) == value


# --- long strings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "\\" * 101,  # backslash runs across cuts
        '\\"' * 50,
        "\U0001f600" * 40,
        "é한" * 40,
        "x" * 31 + "\U0001f600" * 10,
    ],
)
@pytest.mark.parametrize("ascii_escapes", [False, True])
def test_every_offset_of_a_cut(text: str, ascii_escapes: bool) -> None:
    for shift in range(12):  # the same text at every alignment to the window
        value = {"pad": "p" * shift, "content": "c" * shift + text}
        doc = json.dumps(value, ensure_ascii=ascii_escapes).encode()
        assert decode_json(bytearray(doc), window=SMALL) == value


def test_a_long_key_and_a_top_level_long_string() -> None:
    value = {"k" * 60: ["v" * 60, {"k" * 60: 1}]}
    assert decode_json(bytearray(orjson.dumps(value)), window=SMALL) == value
    assert decode_json(bytearray(orjson.dumps("s" * 100)), window=SMALL) == "s" * 100


@pytest.mark.parametrize(
    "doc",
    [
        b'{"a": "' + b"x" * 100 + b'", "a": 1}',  # a later duplicate replaces a long string
        b'{"a": 1, "a": "' + b"x" * 100 + b'"}',
        b'{"a": "' + b"x" * 100 + b'", "b": 2, "a": "' + b"y" * 100 + b'"}',
    ],
)
def test_duplicate_keys_and_long_strings(doc: bytes) -> None:
    assert _same(decode_json(bytearray(doc), window=SMALL), orjson.loads(doc))


def test_the_body_is_dropped_before_joining() -> None:
    raw = bytearray(orjson.dumps({"a": "x" * 100}))
    assert decode_json(raw, window=SMALL) == {"a": "x" * 100}
    assert raw == b""


# --- what orjson refuses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "doc",
    [
        b'{"a": "' + b"x" * 100 + b'\\u00zz"}',  # a bad escape in a long string
        b'{"a": "' + b"x" * 100 + b'\\ud83d"}',  # a lone high surrogate
        b'{"a": "' + b"x" * 100 + b"\xff\xfe" + b'"}',  # not UTF-8
        b'{"a": "' + b"x" * 100 + b"\n" + b'"}',  # a raw control character
        b'{"a": "' + b"x" * 100 + b'", }',  # a trailing comma
        b'{"a": "' + b"x" * 100,  # unterminated
        b'["' + b'\\"' * 50,  # unterminated, after escaped quotes
        b'["' + b"x" * 100 + b'", , "' + b"y" * 100 + b'"]',  # an empty element between long strings
        b'["' + b"x" * 100 + b'", ',  # the end where an element should be
        b'{"a": 1, 5: "' + b"x" * 100 + b'"}',  # a key not a string
        b'{"' + b"k" * 100 + b'" 1}',  # no colon after a long key
        b"[" + b"1, " * 40 + b"]",  # a trailing comma after a run
        b"[" + b"1, " * 40 + b", 2]",  # an empty element
        b"[" + b"1, " * 40 + b"2}",  # the wrong closer
        b"[" + b"1, " * 40 + b"2] x",  # trailing garbage
        b"[" + b"1, " * 40 + b"NaN, Infinity]",
        b"[" + b"1, " * 40 + b"1e400]",  # out of range
        b"\xef\xbb\xbf[" + b"1, " * 40 + b"2]",  # a byte order mark
        b"\x0c[" + b"1, " * 40 + b"2]",  # whitespace orjson does not take
    ],
)
def test_invalid_documents_raise_as_orjson_does(doc: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(doc)
    with pytest.raises(orjson.JSONDecodeError):
        decode_json(bytearray(doc), window=SMALL)


@pytest.mark.parametrize(
    "doc",
    [
        b" " * 100 + b'{"a": [1, 2]}' + b"\r\n\t " * 30,  # whitespace longer than a window
        b"[" + b" " * 100 + b"]",
        b"[1," + b" " * 100 + b"]",
        b'{"a":' + b" " * 100 + b"1}",
        b"[" + b"1" * 100 + b", 0." + b"1" * 100 + b"]",  # numbers longer than a window
        b"[" + b"9" * 30 + b", -" + b"9" * 19 + b", 18446744073709551615, -9223372036854775808]",
    ],
)
def test_edges_as_orjson(doc: bytes) -> None:
    _assert_as_orjson(doc, SMALL)


def _nest(depth: int, opener: bytes, closer: bytes, inner: bytes = b"") -> bytes:
    return opener * depth + inner + closer * depth


@pytest.mark.parametrize(
    "doc",
    [
        _nest(MAX_DEPTH, b"[", b"]"),
        _nest(MAX_DEPTH, b'{"a":', b"}", b"1"),
        _nest(MAX_DEPTH // 2, b'[{"a": ', b"}]", b"1"),
        _nest(MAX_DEPTH, b"[", b"]", b'"' + b"x" * 100 + b'"'),  # a long string at the bottom
    ],
)
@pytest.mark.parametrize("extra", [0, 1])
def test_nesting_to_orjsons_limit_and_one_past(doc: bytes, extra: int) -> None:
    doc = b"[" * extra + doc + b"]" * extra
    _assert_as_orjson(doc, SMALL)
    assert (extra == 0) == _parses(doc)


@pytest.mark.parametrize("deepest", [MAX_DEPTH - 1000, MAX_DEPTH - 1000 + 1])
def test_a_run_nested_past_the_limit(deepest: int) -> None:
    # 1000 frames, then runs of small elements 24 or 25 deep: orjson sees only the run, so the
    # decoder must put it back at its depth for orjson to refuse it
    elements = [_nest(24, b"[", b"]", b"1")] * 20 + [_nest(deepest, b"[", b"]", b"1")]
    doc = _nest(1000, b"[", b"]", b",".join(elements))
    _assert_as_orjson(doc, 256)
    assert (deepest <= 24) == _parses(doc)


def _parses(doc: bytes) -> bool:
    try:
        orjson.loads(doc)
    except orjson.JSONDecodeError:
        return False
    return True


# --- large bodies, a window at a time ---------------------------------------------------------


def _token_ids(count: int) -> bytes:
    return orjson.dumps({"prompt": list(range(1_000_000, 1_000_000 + count))})


def _chat(count: int, text: str = 'with "quotes", commas and [brackets]') -> bytes:
    messages = [{"role": "user", "content": f"message {i}, {text}"} for i in range(count)]
    return orjson.dumps({"model": "m", "messages": messages, "max_tokens": 5})


@pytest.mark.parametrize(
    "make", [lambda: _token_ids(1_000_000), lambda: _chat(100_000)], ids=["8 MB of ints", "6 MB of messages"]
)
def test_a_large_body_is_decoded_a_window_at_a_time(
    make: Callable[[], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = make()
    sizes: list[int] = []

    def loads(data: bytes | bytearray) -> Any:
        sizes.append(len(data))
        return orjson.loads(data)

    monkeypatch.setattr(json_body, "orjson", SimpleNamespace(loads=loads, JSONDecodeError=orjson.JSONDecodeError))
    # orjson.dumps tells 1 from 1.0 and keeps key order, and is quicker here than _same
    assert orjson.dumps(decode_json(bytearray(doc))) == orjson.dumps(orjson.loads(doc))
    assert max(sizes) <= WINDOW + 8  # a run and its brackets
    assert sum(sizes) < 1.05 * len(doc)  # each byte decoded about once


@pytest.mark.parametrize(
    "doc",
    [
        _chat(2000),
        _chat(2000, text="a [ in each: every guess is off, the exact scan finds each cut"),
        orjson.dumps({"input": [[i / 7 for i in range(100)]] * 1000}),  # arrays of floats
        orjson.dumps([[i / 7 for i in range(400)]] * 5),  # each longer than a window: guesses past its end
        orjson.dumps({"logit_bias": {str(i): i % 100 for i in range(20_000)}}),
        orjson.dumps([{"content": "x" * 50_000, "n": i} for i in range(20)]),  # long strings in a run
        _nest(30, b'{"a": [', b"]}", b",".join([b"1"] * 20_000)),  # nested past the scan's levels
    ],
)
def test_no_orjson_call_is_given_much_more_than_a_window(doc: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    window = 4096
    sizes: list[int] = []

    def loads(data: bytes | bytearray) -> Any:
        sizes.append(len(data))
        return orjson.loads(data)

    monkeypatch.setattr(json_body, "orjson", SimpleNamespace(loads=loads, JSONDecodeError=orjson.JSONDecodeError))
    assert _same(decode_json(bytearray(doc), window=window), orjson.loads(doc))
    assert max(sizes) <= window + 2 * 64  # a run at depth <= 64 and its brackets
