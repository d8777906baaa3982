"""decode_json equals orjson.loads on every document, with its long strings cut in pieces at
every kind of place: inside UTF-8 sequences, escapes, surrogate pairs and backslash runs."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni.api.schemas import json_body
from omni.api.schemas.json_body import decode_json, long_strings

WINDOW = 32  # the smallest window: cuts land everywhere
LONG = 40

# Characters that make cuts hard: multi-byte UTF-8, astral (a surrogate pair when escaped),
# quotes and backslashes (escaped), control characters (\n, \u0001).
_TRICKY = st.sampled_from(["\\", '"', "\n", "\x01", "é", "한", "\U0001f600", "\ud7ff", "a", "u", "D8"])
_TEXT = st.lists(st.one_of(_TRICKY, st.text(max_size=3)), max_size=80).map("".join)
_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10, 10), _TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)),
    max_leaves=12,
)


def _decode(doc: bytes) -> Any:
    return decode_json(bytearray(doc), window=WINDOW, long_string=LONG)


@settings(max_examples=200, deadline=None)
@given(_VALUES, st.booleans())
def test_equals_orjson_for_any_document(value: Any, ascii_escapes: bool) -> None:
    # ensure_ascii writes every non-ASCII character as \uXXXX (astral ones as a surrogate pair)
    doc = json.dumps(value, ensure_ascii=ascii_escapes).encode()
    assert _decode(doc) == orjson.loads(doc)


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
        assert long_strings(bytearray(doc), LONG), "the text is a long string"
        assert _decode(doc) == value


def test_finds_the_long_strings_only() -> None:
    doc = bytearray(orjson.dumps({"a": "x" * 10, "b": ["y" * 50, 'q"' * 30], "c": "z" * 39}))
    spans = long_strings(doc, LONG)
    assert [bytes(doc[s:e]) for s, e in spans] == [b"y" * 50, b'q\\"' * 30]


@pytest.mark.parametrize(
    "doc",
    [
        b'{"a": "' + b"x" * 100 + b'\\u00zz"}',  # a bad escape in a long string
        b'{"a": "' + b"x" * 100 + b'\\ud83d"}',  # a lone high surrogate
        b'{"a": "' + b"x" * 100 + b"\xff\xfe" + b'"}',  # not UTF-8
        b'{"a": "' + b"x" * 100 + b"\n" + b'"}',  # a raw control character
        b'{"a": "' + b"x" * 100 + b'", }',  # a bad skeleton
        b'{"a": "' + b"x" * 100,  # unterminated
    ],
)
def test_invalid_documents_raise_as_orjson_does(doc: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(doc)
    with pytest.raises(orjson.JSONDecodeError):
        _decode(doc)


def test_a_placeholder_key_and_a_top_level_string() -> None:
    value = {"k" * 60: ["v" * 60, {"k" * 60: 1}]}
    assert _decode(orjson.dumps(value)) == value
    assert _decode(orjson.dumps("s" * 100)) == "s" * 100


def test_the_body_is_dropped_before_joining() -> None:
    raw = bytearray(orjson.dumps({"a": "x" * 100}))
    assert decode_json(raw, window=WINDOW, long_string=LONG) == {"a": "x" * 100}
    assert raw == b""


def test_many_small_values_are_one_orjson_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_body, "_MAX_SCAN_STEPS", 10)
    doc = bytearray(orjson.dumps({"many": ["s"] * 20, "long": "x" * 100}))
    assert long_strings(doc, LONG) == []  # the scan gave up
    assert _decode(bytes(doc)) == orjson.loads(doc)
