"""A large JSON body decoded without holding the GIL for long at a time.

orjson decodes a document in one C call that holds the GIL throughout, in a worker thread too:
on a small box about 2.5 ms a megabyte of strings and 11 ms a megabyte of small values, so a
64 MB array of token ids stopped the event loop for 700 ms. decode_json hands orjson at most
about `window` bytes a call, whatever the body's shape, and returns what orjson.loads(raw) does.

A body of up to a window is one call. In a larger one, each array or object too large for a
window is a frame, filled a run of whole elements at a time, one orjson call a run; an element
too large for a window is placed by hand: a string decoded in pieces, an array or object as a
frame of its own.

    raw     {"model": "m", "messages": [{"role": ...}, {"role": ...}, ... 60 MB ..., {...}]}
    frames  ^ top level                 ^ messages (a member too large for a window)
    runs     "model": "m"                {"role": ...}, {"role": ...}     about a window each
                                         ^start                     ^cut
    orjson  {"model": "m"}              [{"role": ...}, {"role": ...}]    then top.update(...)
                                                                          or messages.extend(...)

The next run starts past the cut, a comma between two of the frame's elements. The cut is first
guessed with bytes.count (as many openers as closers and an even number of quotes before it,
whatever a string holds), and orjson checks the guess: the run starts at an element boundary, so
orjson reads it as it would read the whole body, and parses it only if the cut is an element
boundary too. With no guess, or a refused one, an exact scan finds the cut, a _SCAN_STEP of
bytes a regex call: it steps over string literals and nested elements (to _SCAN_LEVELS deep) in
C, and finds the frame's closer as well. An element the scan sees no end of is placed by hand.

A run is decoded inside depth - 1 extra brackets, back at its frame's depth, so that orjson
refuses what nests deeper than MAX_DEPTH as it would in the whole body; a frame checks its own.

A long string's pieces are cut between two characters of the decoded text: never inside a
UTF-8 sequence, an escape, or a surrogate pair's two escapes (_safe_cut):

    raw        ..., "content": "....... 60 MB ......."}
                                ^start              ^end (the closing quote)
    string     orjson.loads('"' + raw[start:c1] + '"') + ... + orjson.loads('"' + raw[ck:end] + '"')

The pieces stand in the result until the body is decoded and raw emptied, then are joined with
the GIL released (omni/shared/gil_free.py join_str: the copy and its page faults took ~55 ms for 60 MB).

What decode_json accepts is what orjson accepts: orjson validates every byte of each run, string
and scalar, and the glue between them (commas, colons, closers, whitespace) is checked here; only
an error's message and position differ. What stays long: a window of small values is one call
(~3 ms for the default 256 KiB here; 1 MiB windows held it ~11 ms and cost a short chat
beside 8M ids up to 105 ms, 256 KiB ones 64 ms), a number longer than a window is decoded whole, and a refused guess costs
its call: the last window of a frame that reaches past its closer, or windows of strings full of
unbalanced brackets (which then go to the exact scan, ~18 ms a MB here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeAlias

import orjson

from omni.shared.gil_free import join_str

WINDOW = 1 << 18  # bytes of the body per orjson call
# orjson refuses a document whose arrays and objects nest deeper than this.
MAX_DEPTH = 1024
# Bytes one regex call of the exact scan covers: ~2 ms on a small box, all under the GIL.
_SCAN_STEP = 1 << 17
# Nesting the exact scan steps over in C; a deeper element is placed by hand, a frame.
_SCAN_LEVELS = 8
# Commas (or openers) a guess backs over from the window's end before leaving the cut to the scan.
_GUESSES = 32
# A frame whose guesses keep missing leaves up to 2 ** this - 1 windows in a row to the scan.
_MAX_MISSES = 4

_QUOTE, _BACKSLASH, _COMMA, _COLON = ord('"'), ord("\\"), ord(","), ord(":")
_HEX = frozenset(b"0123456789abcdefABCDEF")

_STRING = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_FLAT = rb'[^"\[\]{}]++'  # numbers, literals, commas, colons, whitespace (and junk orjson refuses)


def _nested(levels: int) -> bytes:
    """Text that closes each bracket it opens, nesting at most `levels` deep. Brackets are not
    matched by kind: orjson does that."""
    text = rb"(?:" + _STRING + rb"|" + _FLAT + rb")*+"
    for _ in range(levels):
        text = rb"(?:" + _STRING + rb"|" + _FLAT + rb"|[\[{]" + text + rb"[\]}])*+"
    return text


# One of a frame's elements, from an element boundary, and a run of them each followed by its
# comma. Possessive throughout: what does not end within the call (a string or nested element
# cut by endpos, or one nested too deep) stops the match just before it. (No capturing groups:
# CPython 3.11's re fails on some inside possessive repeats.)
_ELEMENT_TEXT = rb"(?:" + _STRING + rb'|[^"\[\]{},]++|[\[{]' + _nested(_SCAN_LEVELS - 1) + rb"[\]}])*+"
_ELEMENT = re.compile(_ELEMENT_TEXT, re.DOTALL)
_ELEMENTS = re.compile(rb"(?:" + _ELEMENT_TEXT + rb",)*+", re.DOTALL)
_NOT_COUNTED = bytes(b for b in range(256) if b not in b'[]{}"')  # deleted before a guess counts
_WHITESPACE = re.compile(rb"[ \t\n\r]*+")  # orjson's whitespace, no more
_SCALAR = re.compile(rb'[^ \t\n\r,:\[\]{}"]*+')

Container: TypeAlias = list[Any] | dict[str, Any]

# Elements of one array or object, past which a body is refused as it is decoded: far past
# any field's own bound (16,384 chat messages, 2^20 prompt ids), it ends a body of millions of
# values before they are all made, kept and freed.
MAX_ITEMS = 1 << 21
# Items freed per step when a refused body is emptied.
_FREE_STEP = 4096


class TooManyItems(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"an array or object in the body holds more than {limit} items")
        self.limit = limit


def empty_in_steps(value: Any) -> None:
    """Empties value's lists and dicts, at every depth, a few thousand items at a time: freeing
    8 million of them at once is one C call that holds the GIL ~250 ms; each step here is a
    short one, and other threads run between steps."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            while item:
                tail = item[-_FREE_STEP:]
                del item[-_FREE_STEP:]
                stack += [v for v in tail if isinstance(v, list | dict)]
                del tail
        elif isinstance(item, dict):
            while item:
                _, v = item.popitem()
                if isinstance(v, list | dict):
                    stack.append(v)


def decode_json(raw: bytearray, *, window: int = WINDOW) -> Any:
    """orjson.loads(raw), each orjson call on at most about `window` bytes of it. Raises
    orjson.JSONDecodeError as orjson.loads does. Past one window, raw is emptied once decoded,
    before the long strings are joined: the body and its strings never coexist whole."""
    assert window >= 32  # room to back a cut off an escape or a UTF-8 sequence
    if len(raw) <= window:
        return orjson.loads(raw)
    decoder = _Decoder(raw, window)
    try:
        decoder.decode()
    except TooManyItems:
        empty_in_steps(decoder.top)
        raise
    raw.clear()
    return decoder.result()


@dataclass(slots=True, eq=False)
class _Frame:
    """An array or object too large for one window, filled a run of whole elements at a time."""

    value: Container
    depth: int  # its nesting in the document: 1 for the top level
    start: int  # the first byte not decoded yet: just past the opener or a separating comma
    fresh: bool = True  # nothing decoded yet: a blank run is then the empty container
    misses: int = 0  # guesses in a row that held no run: strings full of brackets fool them all
    unguessed: int = 0  # windows left to the exact scan alone, 2 ** misses - 1 after a miss

    @property
    def brackets(self) -> tuple[bytes, bytes]:
        return (b"[", b"]") if isinstance(self.value, list) else (b"{", b"}")


class _LongString:
    """A long string's decoded pieces, standing where the string goes until they are joined."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces


class _Decoder:
    """One body's decoding: the frames open, innermost last, and the long strings left to join."""

    def __init__(self, raw: bytearray, window: int) -> None:
        self.raw = raw
        self.window = window
        self.top: list[Any] = []  # the document's value, once decoded
        self.frames: list[_Frame] = []
        # (container, index or key, slot) of each long string placed
        self.long_strings: list[tuple[Container, Any, _LongString]] = []

    def decode(self) -> None:
        self._place(self._skip_whitespace(0), self.top, None)
        while self.frames:
            self._step(self.frames[-1])

    def result(self) -> Any:
        """The value, its long strings joined (once raw is no longer needed)."""
        for container, key, slot in self.long_strings:
            if container[key] is slot:  # not since replaced by a duplicate key's value
                container[key] = join_str(slot.pieces)
            slot.pieces = []
        return self.top[0]

    # --- a frame's elements ---------------------------------------------------------------

    def _step(self, frame: _Frame) -> None:
        stop = min(frame.start + self.window, len(self.raw))
        if frame.unguessed:
            frame.unguessed -= 1
        elif self._guessed_run(frame, stop):
            frame.misses = 0
            return
        else:
            frame.misses = min(frame.misses + 1, _MAX_MISSES)
            frame.unguessed = (1 << frame.misses) - 1
        closer, cut = self._scan(frame.start, stop)
        if closer is not None:
            run = self._run(frame, closer)
            if not run and not frame.fresh:
                raise _error("a comma before the end of an array or object", closer)
            self._merge(frame, run, closer)
            self._close(frame, closer)
        elif cut is not None:
            run = self._run(frame, cut)
            if not run:
                raise _error("no value before a comma", cut)
            self._merge(frame, run, cut + 1)
        else:
            self._place_next(frame)

    def _guessed_run(self, frame: _Frame, stop: int) -> bool:
        """Whether a guessed cut in raw[frame.start:stop] held: its run is then merged."""
        cut = self._guess(frame.start, stop)
        if cut is None:
            return False
        try:
            run = self._run(frame, cut)
        except orjson.JSONDecodeError:
            return False  # a wrong guess, or an error the exact scan will come to
        if not run:  # a blank run: left to the scan to judge
            return False
        self._merge(frame, run, cut + 1)
        return True

    def _guess(self, start: int, stop: int) -> int | None:
        """A comma in raw[start:stop] likely to separate two of the frame's elements, or None.
        Before it, counted as if no string held a bracket: as many openers as closers and an even
        number of quotes (escaped ones blanked out first)."""
        text = _blank_escapes(bytes(self.raw[start:stop]))
        kept = text.translate(None, _NOT_COUNTED)  # one pass, where bytes.count is one a byte
        counts = _Counts.of(kept, 0, len(kept))
        at = len(text)
        for _ in range(_GUESSES):
            if counts.depth > 0:  # inside an element not closed yet: back out of it
                back = max(
                    text.rfind(b"[", 0, at) if counts.square else -1,
                    text.rfind(b"{", 0, at) if counts.curly else -1,
                )
            else:
                back = text.rfind(b",", 0, at)
            if back < 0:
                return None
            counts = counts.less(_Counts.of(text, back, at))
            at = back
            if text[at] == _COMMA and counts.depth == 0 and counts.quotes % 2 == 0:
                return start + at
        return None

    def _scan(self, start: int, stop: int) -> tuple[int | None, int | None]:
        """(the frame's closer, None) where raw[start:stop] holds it, else (None, the last comma
        in it that separates two of the frame's elements, or None if there is none before an
        element longer than _SCAN_STEP or nested deeper than _SCAN_LEVELS)."""
        raw = self.raw
        cut = None
        at = start
        while at < stop:
            end = min(at + _SCAN_STEP, stop)
            after_comma = _match(_ELEMENTS, raw, at, end).end()
            if after_comma > at:
                cut = after_comma - 1
            element_end = _match(_ELEMENT, raw, after_comma, end).end()
            if element_end == end:  # a step may end inside a number or whitespace: flat text goes on
                at = end
            elif raw[element_end] in b"]}":
                return element_end, None
            elif after_comma > at and end < stop:  # an element across the step's end: a step from its start
                at = after_comma
            else:  # an element that does not end within a step, or nests too deep
                break
        return None, cut

    def _run(self, frame: _Frame, end: int) -> Container:
        """orjson's decoding of raw[frame.start:end], whole elements of the frame, put back at the
        frame's depth: [[[ {elements} ]]] for an object three deep."""
        opener, closer = frame.brackets
        outer = frame.depth - 1
        value = orjson.loads(b"".join((b"[" * outer, opener, self.raw[frame.start : end], closer, b"]" * outer)))
        for _ in range(outer):
            if len(value) != 1:  # the run closed its frame and went on in the brackets around it
                raise _error("elements past the end of an array or object", end)
            value = value[0]
        return value

    def _merge(self, frame: _Frame, run: Container, start: int) -> None:
        if isinstance(frame.value, list):
            frame.value.extend(run)
        else:
            frame.value.update(run)  # a duplicate key keeps its first place, takes the last value
        if len(frame.value) > MAX_ITEMS:
            raise TooManyItems(MAX_ITEMS)
        frame.start = start
        frame.fresh = False

    def _place_next(self, frame: _Frame) -> None:
        """The frame's next element, one the scan saw no end of, part by part."""
        at = self._skip_whitespace(frame.start)
        if at < len(self.raw) and self.raw[at] in b"]}":  # past a window of whitespace
            if not frame.fresh:
                raise _error("a comma before the end of an array or object", at)
            self._close(frame, at)
            return
        frame.fresh = False
        if isinstance(frame.value, list):
            self._place(at, frame.value, None)
            return
        key, at = self._string(at, join=True)
        at = self._skip_whitespace(at)
        if at >= len(self.raw) or self.raw[at] != _COLON:
            raise _error("expected a colon after an object key", at)
        self._place(self._skip_whitespace(at + 1), frame.value, key)

    def _close(self, frame: _Frame, at: int) -> None:
        if self.raw[at : at + 1] != frame.brackets[1]:
            raise _error("a closing bracket of the wrong kind", at)
        self.frames.pop()
        self._after_value(at + 1)

    # --- values placed by hand ------------------------------------------------------------

    def _place(self, at: int, container: Container, key: str | None) -> None:
        """The value at raw[at] put in container (appended, or under key): a string or scalar now,
        an array or object as a new frame, filled by the steps that follow."""
        raw = self.raw
        if at >= len(raw):
            raise _error("unexpected end of data", at)
        if raw[at] == _QUOTE:
            value, end = self._string(at, join=False)
            slot = _put(container, key, value)
            if isinstance(value, _LongString):
                self.long_strings.append((container, slot, value))
            self._after_value(end)
        elif raw[at] in b"[{":
            depth = (self.frames[-1].depth if self.frames else 0) + 1
            if depth > MAX_DEPTH:
                raise _error("recursion limit reached", at)
            child: Container = [] if raw[at] == ord("[") else {}
            _put(container, key, child)
            self.frames.append(_Frame(child, depth, at + 1))
        else:  # a number or literal, cut at the first byte that cannot be in one
            end = self._span(_SCALAR, at)
            _put(container, key, orjson.loads(raw[at:end]))
            self._after_value(end)

    def _string(self, at: int, *, join: bool) -> tuple[Any, int]:
        """The string whose opening quote is raw[at], and the position past its closing quote: in
        one call if it fits in a window, else in pieces (joined now if join, else left to join)."""
        if at >= len(self.raw) or self.raw[at] != _QUOTE:
            raise _error("expected a string", at)
        end = self._closing_quote(at)
        if end + 1 - at <= self.window:
            return orjson.loads(self.raw[at : end + 1]), end + 1
        pieces = _decode_string(self.raw, at + 1, end, self.window)
        return (join_str(pieces) if join else _LongString(pieces)), end + 1

    def _closing_quote(self, opening: int) -> int:
        """Where the string opened at raw[opening] ends: memchr for a quote a window at a time,
        and once an escaped one shows up, a window's escapes blanked out (same length, as in
        _guess) so that the first quote left is the closing one: not one Python step a quote."""
        raw, n = self.raw, len(self.raw)
        at = opening + 1
        while at < n:
            stop = min(at + self.window, n)
            quote = raw.find(b'"', at, stop)
            if quote < 0:
                at = stop
            elif _backslashes_before(raw, quote, opening + 1) % 2 == 0:
                return quote
            else:  # quote + 1 follows an escape: the window from there starts in step with them
                text = bytes(raw[quote + 1 : min(quote + 1 + self.window, n)])
                found = _blank_escapes(text).find(b'"')
                if found >= 0:
                    return quote + 1 + found
                trailing = len(text) - len(text.rstrip(b"\\"))
                at = quote + 1 + len(text) - trailing % 2  # the next window starts at an escape
        raise _error("unterminated string", opening)

    def _after_value(self, at: int) -> None:
        """What follows a value placed by hand: a comma (its frame goes on), its frame's closer
        (and what follows that, up the frames), or, past the top-level value, the end."""
        raw = self.raw
        while True:
            at = self._skip_whitespace(at)
            if not self.frames:
                if at < len(raw):
                    raise _error("trailing characters", at)
                return
            frame = self.frames[-1]
            if at < len(raw) and raw[at] == _COMMA:
                frame.start = at + 1
                return
            if raw[at : at + 1] != frame.brackets[1]:
                raise _error("expected a comma or a closing bracket", at)
            self.frames.pop()
            at += 1

    def _skip_whitespace(self, at: int) -> int:
        return self._span(_WHITESPACE, at)

    def _span(self, pattern: re.Pattern[bytes], at: int) -> int:
        """The end of the run of pattern's bytes from at, matched a _SCAN_STEP at a time."""
        n = len(self.raw)
        while True:
            stop = min(at + _SCAN_STEP, n)
            at = _match(pattern, self.raw, at, stop).end()
            if at < stop or stop == n:
                return at


@dataclass(frozen=True, slots=True)
class _Counts:
    """Brackets and quotes in a span of text, counted whether or not a string holds them."""

    square: int  # [
    curly: int  # {
    depth: int  # openers less closers
    quotes: int

    @classmethod
    def of(cls, text: bytes | bytearray, lo: int, hi: int) -> _Counts:
        square, curly = text.count(b"[", lo, hi), text.count(b"{", lo, hi)
        closers = text.count(b"]", lo, hi) + text.count(b"}", lo, hi)
        return cls(square, curly, square + curly - closers, text.count(b'"', lo, hi))

    def less(self, other: _Counts) -> _Counts:
        return _Counts(
            self.square - other.square, self.curly - other.curly, self.depth - other.depth, self.quotes - other.quotes
        )


def _put(container: Container, key: str | None, value: Any) -> Any:
    """value appended to a list or set under key in a dict; returns its index or key."""
    if isinstance(container, list):
        container.append(value)
        return len(container) - 1
    assert key is not None
    container[key] = value
    return key


def _match(pattern: re.Pattern[bytes], raw: bytearray, at: int, stop: int) -> re.Match[bytes]:
    match = pattern.match(raw, at, stop)
    assert match is not None  # each pattern matches the empty text
    return match


def _error(what: str, at: int) -> orjson.JSONDecodeError:
    return orjson.JSONDecodeError(what, "", at)


def _blank_escapes(text: bytes) -> bytes:
    """text, from an escape boundary, with each escaped backslash and escaped quote blanked out
    (same length): a quote left delimits a string. Backslashes pair from the left, as escapes do."""
    if b"\\" not in text or b'\\"' not in text:  # memchr first: quick when there is no backslash
        return text
    return text.replace(b"\\\\", b"\0\0").replace(b'\\"', b"\0\0")


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
