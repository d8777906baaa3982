"""JsonCloser: a json_object answer that runs into max_tokens still ends as a JSON object.

"Any JSON object" has no bound on its length, so a model can still be inside a string or a
nested array when its token budget runs out, and the client gets text no JSON parser takes.
The closer follows the output byte by byte and always knows the shortest text that completes
it (close the string, finish the number or literal, give a dangling key a null, close every
open container). When the tokens left are about to be too few for that text, it forces it, one
single-byte token at a time; the request then ends with finish_reason "length", as a cut
answer does, but parseable.

    {"a": [1, {"b": "xy|        <- budget nearly spent
    {"a": [1, {"b": "xy"}]}     <- forced: "}]}

The grammar still checks every forced token (the closing text is valid JSON by construction).
It needs a byte-level tokenizer, where every byte is a token of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

_DIGITS = b"0123456789"
_NUMBER = b"0123456789+-.eE"
# Bytes a number may not end with; one more digit completes it.
_NUMBER_OPEN_END = b"+-.eE"
_LITERALS = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}
# The lowest valid second byte of a UTF-8 sequence, by lead byte (RFC 3629's table).
_SECOND_BYTE_MIN = {0xE0: 0xA0, 0xF0: 0x90}


class _Mode(enum.Enum):
    START = enum.auto()  # nothing yet: the object's "{"
    KEY_OR_CLOSE = enum.auto()  # just after "{"
    KEY = enum.auto()  # after "," in an object
    COLON = enum.auto()
    VALUE = enum.auto()  # after ":" or "," in an array
    VALUE_OR_CLOSE = enum.auto()  # just after "["
    AFTER_VALUE = enum.auto()  # "," or the container's close
    STRING = enum.auto()
    ESCAPE = enum.auto()  # after a backslash in a string
    UNICODE = enum.auto()  # inside \uXXXX
    NUMBER = enum.auto()
    LITERAL = enum.auto()
    DONE = enum.auto()


class JsonScanner:
    """Where a compact JSON object's text is, and the shortest bytes that would complete it."""

    def __init__(self) -> None:
        self.mode = _Mode.START
        self.stack: list[int] = []  # open containers: ord("{") or ord("[")
        self.string_is_key = False
        self.hex_left = 0
        self.literal_left = b""
        self.number_last = 0
        self.utf8_lead = 0  # lead byte of a character whose continuation bytes are still due
        self.utf8_left = 0

    def feed(self, data: bytes) -> None:
        for b in data:
            self._byte(b)

    def _byte(self, b: int) -> None:
        m = self.mode
        if m is _Mode.STRING:
            if self.utf8_left:
                self.utf8_left -= 1
                self.utf8_lead = 0
            elif b >= 0xC0:
                self.utf8_lead, self.utf8_left = b, (1 if b < 0xE0 else 2 if b < 0xF0 else 3)
            elif b == ord("\\"):
                self.mode = _Mode.ESCAPE
            elif b == ord('"'):
                self.mode = _Mode.COLON if self.string_is_key else _Mode.AFTER_VALUE
            return
        if m is _Mode.ESCAPE:
            self.mode, self.hex_left = (_Mode.UNICODE, 4) if b == ord("u") else (_Mode.STRING, 0)
            return
        if m is _Mode.UNICODE:
            self.hex_left -= 1
            if not self.hex_left:
                self.mode = _Mode.STRING
            return
        if m is _Mode.LITERAL:
            self.literal_left = self.literal_left[1:]
            if not self.literal_left:
                self.mode = _Mode.AFTER_VALUE
            return
        if m is _Mode.NUMBER:
            if b in _NUMBER:
                self.number_last = b
                return
            self.mode = _Mode.AFTER_VALUE  # the byte that ends a number is read after it
            m = self.mode
        if m is _Mode.START:
            if b == ord("{"):
                self.stack.append(b)
                self.mode = _Mode.KEY_OR_CLOSE
            return
        if m in (_Mode.KEY_OR_CLOSE, _Mode.KEY):
            if b == ord('"'):
                self.mode, self.string_is_key = _Mode.STRING, True
            elif b == ord("}"):
                self._close()
            return
        if m is _Mode.COLON:
            if b == ord(":"):
                self.mode = _Mode.VALUE
            return
        if m in (_Mode.VALUE, _Mode.VALUE_OR_CLOSE):
            if m is _Mode.VALUE_OR_CLOSE and b == ord("]"):
                self._close()
            else:
                self._value(b)
            return
        if m is _Mode.AFTER_VALUE:
            if b == ord(","):
                self.mode = _Mode.KEY if self.stack[-1] == ord("{") else _Mode.VALUE
            elif b in (ord("}"), ord("]")):
                self._close()

    def _value(self, b: int) -> None:
        if b in (ord("{"), ord("[")):
            self.stack.append(b)
            self.mode = _Mode.KEY_OR_CLOSE if b == ord("{") else _Mode.VALUE_OR_CLOSE
        elif b == ord('"'):
            self.mode, self.string_is_key = _Mode.STRING, False
        elif b in _LITERALS:
            self.mode, self.literal_left = _Mode.LITERAL, _LITERALS[b][1:]
        elif b in _NUMBER:
            self.mode, self.number_last = _Mode.NUMBER, b

    def _close(self) -> None:
        self.stack.pop()
        self.mode = _Mode.AFTER_VALUE if self.stack else _Mode.DONE

    def closing(self) -> bytes:
        """The shortest bytes that make the text so far a complete JSON object."""
        out = bytearray()
        m = self.mode
        if m is _Mode.DONE:
            return b""
        if m is _Mode.START:
            return b"{}"
        if m in (_Mode.STRING, _Mode.ESCAPE, _Mode.UNICODE):
            if self.utf8_left:
                first = _SECOND_BYTE_MIN.get(self.utf8_lead, 0x80) if self.utf8_lead else 0x80
                out += bytes([first]) + b"\x80" * (self.utf8_left - 1)
            if m is _Mode.ESCAPE:
                out += b"n"
            elif m is _Mode.UNICODE:
                out += b"0" * self.hex_left
            out += b'"'
            m = _Mode.COLON if self.string_is_key else _Mode.AFTER_VALUE
        elif m is _Mode.NUMBER:
            if self.number_last in _NUMBER_OPEN_END:
                out += b"0"
            m = _Mode.AFTER_VALUE
        elif m is _Mode.LITERAL:
            out += self.literal_left
            m = _Mode.AFTER_VALUE
        if m is _Mode.KEY:
            out += b'"":null'
        elif m is _Mode.COLON:
            out += b":null"
        elif m is _Mode.VALUE:
            out += b"null"
        for opener in reversed(self.stack):
            out += b"}" if opener == ord("{") else b"]"
        return bytes(out)


class JsonCloser:
    """Forces the closing text of a json_object answer once the budget left only just fits it."""

    def __init__(self, token_bytes: Sequence[bytes], byte_tokens: Sequence[int], max_tokens: int) -> None:
        self._token_bytes = token_bytes
        self._byte_tokens = byte_tokens  # the token of each byte value, 256 of them
        self._left = max_tokens
        # One free token can lengthen the closing text by at most its own length plus a null
        # for a key it opens; forcing starts that much early so the budget always suffices.
        self._margin = max(len(b) for b in token_bytes) + len(b'"":null')
        self.scanner = JsonScanner()
        self.closing_now = False  # the answer is being closed: it was cut short

    @classmethod
    def for_tokenizer(cls, token_bytes: Sequence[bytes], max_tokens: int) -> JsonCloser | None:
        """None when some byte has no token of its own (then the closing text cannot be spelled)."""
        byte_tokens: dict[int, int] = {}
        for token_id, data in enumerate(token_bytes):
            if len(data) == 1 and data[0] not in byte_tokens:
                byte_tokens[data[0]] = token_id
        if len(byte_tokens) < 256:
            return None
        return cls(token_bytes, [byte_tokens[b] for b in range(256)], max_tokens)

    @property
    def forced_token_id(self) -> int | None:
        closing = self.scanner.closing()
        if not closing:
            return None
        if self.closing_now or self._left <= len(closing) + self._margin:
            return self._byte_tokens[closing[0]]
        return None

    def spend(self) -> None:
        """A token before the answer began (reasoning): it counts against the budget only."""
        self._left -= 1

    def advance(self, token_id: int) -> None:
        if self.forced_token_id is not None:
            self.closing_now = True
        self._left -= 1
        data = self._token_bytes[token_id] if 0 <= token_id < len(self._token_bytes) else b""
        self.scanner.feed(data)
