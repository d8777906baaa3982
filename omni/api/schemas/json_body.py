"""A large JSON body decoded without holding the GIL for long at a time.

orjson decodes a document in one C call that holds the GIL throughout, in a worker thread too:
about 2.5 ms a megabyte on a small box, so a 60 MB prompt froze the event loop for 150 ms. Such
a body is nearly always a few long strings (a prompt, a data URL) in a small skeleton, so
decode_json decodes each long string in pieces of about WINDOW bytes and the skeleton, with a
placeholder for each long string, in one call:

    raw        {"messages": [{"role": "user", "content": "....... 60 MB ......."}]}
                                                        ^start              ^end (the closing quote)
    skeleton   {"messages": [{"role": "user", "content": "<placeholder 0>"}]}
    string 0   orjson.loads('"' + raw[start:c1] + '"') + ... + orjson.loads('"' + raw[ck:end] + '"')

A cut c falls between two characters of the decoded text: never inside a UTF-8 sequence, an
escape, or a surrogate pair's two escapes (_safe_cut). orjson still validates every byte, so
the result equals orjson.loads(raw) for every document; only an error's position differs.

A long string's pieces are joined with the GIL released (omni/gil_free.py join_str: the
copy and its page faults took ~55 ms for 60 MB here). What stays long: a body made of many
values rather than long strings is decoded in one call as before (the scan gives up on it:
_MAX_SCAN_STEPS).
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from omni.gil_free import join_str

WINDOW = 1 << 20  # bytes of raw string per orjson call
LONG_STRING_BYTES = WINDOW  # a string at least this long (raw, escapes as written) is decoded in pieces
# Quotes looked at by the scan, strings and escaped quotes alike. Past this the body is many
# small values, not a few long strings, and one orjson call is cheaper than scanning on.
_MAX_SCAN_STEPS = 1 << 16

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_HEX = frozenset(b"0123456789abcdefABCDEF")


def decode_json(raw: bytearray, *, window: int = WINDOW, long_string: int = LONG_STRING_BYTES) -> Any:
    """orjson.loads(raw), each C call on at most about `window` bytes but the skeleton's.
    Raises orjson.JSONDecodeError as orjson.loads does. raw is emptied once it is no longer
    needed, before the long strings are joined: the body and its strings never coexist whole."""
    assert window >= 32  # room to back a cut off an escape or a UTF-8 sequence
    spans = long_strings(raw, long_string)
    if not spans:  # no long string, an unterminated one, or a body of many values
        return orjson.loads(raw)
    nonce = secrets.token_hex(8)  # a client cannot write a placeholder it cannot guess
    placeholders = [f"omni-long-string-{nonce}-{i}" for i in range(len(spans))]
    parts: list[bytes | bytearray] = []
    last = 0
    for (start, end), placeholder in zip(spans, placeholders):
        parts += [raw[last:start], placeholder.encode()]  # raw[last:start] ends with the opening quote
        last = end
    parts.append(raw[last:])
    skeleton = orjson.loads(b"".join(parts))
    del parts
    pieces = [_decode_string(raw, start, end, window) for start, end in spans]
    raw.clear()
    strings = dict(zip(placeholders, (join_str(p) for p in pieces)))
    del pieces
    return _substitute(skeleton, strings)


def long_strings(raw: bytearray, long_string: int = LONG_STRING_BYTES) -> list[tuple[int, int]]:
    """(start, end) of each string whose raw text raw[start:end] (quotes excluded) is at least
    long_string bytes; [] when there is none, when a string is not terminated (orjson will say
    where) or when the scan would take more than _MAX_SCAN_STEPS quotes."""
    spans: list[tuple[int, int]] = []
    steps = 0
    pos = 0
    while (opening := raw.find(b'"', pos)) >= 0:  # outside a string, a quote opens one
        start = end = opening + 1
        while True:  # the first quote after start not escaped by an odd run of backslashes
            steps += 1
            if steps > _MAX_SCAN_STEPS:
                return []
            end = raw.find(b'"', end)
            if end < 0:
                return []
            if _backslashes_before(raw, end, start) % 2 == 0:
                break
            end += 1
        if end - start >= long_string:
            spans.append((start, end))
        pos = end + 1
    return spans


def _backslashes_before(raw: bytearray, i: int, floor: int) -> int:
    """How many backslashes run back from raw[i - 1], not looking below floor."""
    count, step = 0, 16
    while i > floor:
        segment = raw[max(floor, i - step) : i]
        kept = len(segment.rstrip(b"\\"))
        count += len(segment) - kept
        if kept:
            break
        i -= len(segment)
        step = min(2 * step, WINDOW)
    return count


def _decode_string(raw: bytearray, start: int, end: int, window: int) -> list[str]:
    pieces = []
    while start < end:
        cut = end if end - start <= window else _safe_cut(raw, start, start + window)
        pieces.append(orjson.loads(b'"' + raw[start:cut] + b'"'))
        start = cut
    return pieces


def _safe_cut(raw: bytearray, lo: int, cut: int) -> int:
    """The last position at or before cut (and after lo) that splits raw[lo:] between two
    characters of the decoded text, lo being such a position itself. For invalid text it may
    be anywhere: orjson then refuses a piece, as it would the whole."""
    while cut > lo + 1 and 0x80 <= raw[cut] < 0xC0:  # a UTF-8 continuation byte: back to its lead
        cut -= 1
    if _backslashes_before(raw, cut, lo) % 2:  # raw[cut - 1] opens an escape
        cut -= 1
    else:
        for back in range(2, 6):  # inside \uXXXX: raw[cut - back] is its backslash
            at = cut - back
            if at >= lo and raw[at] == _BACKSLASH and raw[at + 1] == ord("u") and _escapes(raw, at, lo):
                cut = at
                break
    at = cut - 6  # right after a high surrogate's escape: its low half goes in the same piece
    if at >= lo and _is_high_surrogate(raw, at) and _escapes(raw, at, lo):
        cut = at
    return cut


def _escapes(raw: bytearray, at: int, lo: int) -> bool:
    """raw[at] is a backslash that opens an escape (not the second of an escaped backslash)."""
    return _backslashes_before(raw, at, lo) % 2 == 0


def _is_high_surrogate(raw: bytearray, at: int) -> bool:
    # \uD800 .. \uDBFF
    return (
        raw[at] == _BACKSLASH
        and raw[at + 1] == ord("u")
        and raw[at + 2] in b"dD"
        and raw[at + 3] in b"89abAB"
        and raw[at + 4] in _HEX
        and raw[at + 5] in _HEX
    )


def _substitute(value: Any, strings: dict[str, str]) -> Any:
    """value with every placeholder (a string, or a key) replaced by its string, iteratively:
    orjson nests up to 1024 levels, past Python's recursion limit."""
    if isinstance(value, str):
        return strings.get(value, value)
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if any(k in strings for k in node):
                items = [(strings.get(k, k), v) for k, v in node.items()]
                node.clear()
                node.update(items)
            for k, v in node.items():
                if isinstance(v, str):
                    if v in strings:
                        node[k] = strings[v]
                elif isinstance(v, dict | list):
                    stack.append(v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, str):
                    if v in strings:
                        node[i] = strings[v]
                elif isinstance(v, dict | list):
                    stack.append(v)
    return value
