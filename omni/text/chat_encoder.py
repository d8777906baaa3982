"""ChatEncoder: a chat prompt's token ids where only the template writes special tokens.

Text a client sends (message content, names, tool definitions, documents, template kwargs) is
text: a `<|im_start|>` or `<|IMAGE_PAD|>` typed in it is tokenized as the characters it is
made of, so no client can forge a turn boundary or a media placeholder. The template's own
markers stay special. Three steps:

    escape   each special token string in a client string -> ESC + two index digits
             (private-use characters no tokenizer or template writes; a literal ESC is
             escaped too, as index 0, so every string comes back exactly)
    render   the chat template over the escaped values (the caller: TextTokenizer.render_chat)
    encode   the rendered text is split at the special tokens left in it, which are the
             template's; each piece between them is unescaped and encoded with special-token
             matching off, and the template's special ids go between the pieces

The tokenizer encodes the text between two special tokens independently of the rest (it splits
out added tokens before normalizing and pre-tokenizing), so for a prompt whose client text holds
no special token the ids equal a plain encode of the rendered text, boundaries included. Special
tokens are found with one regex over a trie of them (a C-speed scan, milliseconds for megabytes;
the tokenizer's own matcher costs nearly what a full encode does).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import tokenizers

from omni.shared.gil_free import join_str

ESC = "\U0010fffd"  # plane 16 private use
_DIGIT_BASE = 0xF0000  # plane 15 private use: an index is two digits in base _RADIX
_RADIX = 4096
_ESCAPE_WINDOW = 1 << 20  # characters of a client string searched for special tokens per regex call


def _index_chars(index: int) -> str:
    high, low = divmod(index, _RADIX)
    return chr(_DIGIT_BASE + high) + chr(_DIGIT_BASE + low)


def _leading_index(part: str) -> int | None:
    """The index written by the two digits part starts with, if it does."""
    digits = [ord(c) - _DIGIT_BASE for c in part[:2]]
    if len(digits) < 2 or not all(0 <= d < _RADIX for d in digits):
        return None
    return digits[0] * _RADIX + digits[1]


def _is_private(text: str) -> bool:
    return any(ord(c) >= _DIGIT_BASE for c in text)


def _trie_pattern(words: list[str]) -> str:
    """A regex matching any of words, longest first at each position (leftmost-longest, as
    the tokenizer's added-token matcher). Children whose subtrees are alike share a class, so
    a run of numbered tokens (<|vision00000|> ... <|vision65535|>) stays a few nodes."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def walk(node: dict[str, Any]) -> str:
        by_rest: dict[str, list[str]] = {}
        for ch, child in node.items():
            if ch:
                by_rest.setdefault(walk(child), []).append(ch)
        branches = []
        for rest, chars in sorted(by_rest.items()):
            head = re.escape(chars[0]) if len(chars) == 1 else "[" + "".join(re.escape(c) for c in sorted(chars)) + "]"
            branches.append(head + rest)
        if not branches:
            return ""
        alternation = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if "" in node:  # a word ends here: the longer match is tried first
            return "(?:" + alternation + ")?"
        return alternation

    return walk(trie)


class ChatEncoder:
    def __init__(self, backend: tokenizers.Tokenizer) -> None:
        added = sorted(backend.get_added_tokens_decoder().items())
        if any(_is_private(t.content) for _, t in added):
            raise ValueError("an added token uses the private-use characters the chat encoder escapes with")
        if len(added) >= _RADIX * _RADIX:
            raise ValueError(f"{len(added)} added tokens: more than the chat encoder can index")
        # content -> (the tokenizer's id, its escape index); index 0 is ESC itself
        self._special: dict[str, tuple[int, int]] = {}
        self._contents = [ESC]
        for token_id, t in added:
            if t.special:
                self._special[t.content] = (token_id, len(self._contents))
                self._contents.append(t.content)
        # Special tokens as written, as the tokenizer matches them (a token that strips the
        # whitespace around it or matches only as a word is matched here as it is written).
        self._finder = re.compile(_trie_pattern(list(self._special))) if self._special else None
        self._longest_special = max(map(len, self._special), default=0)
        # The same tokenizer with special-token matching off, for the text between markers.
        self._plain = tokenizers.Tokenizer.from_str(backend.to_str())
        self._plain.encode_special_tokens = True

    # ---- escape: client strings, before rendering ----------------------------------------

    def escape(self, value: Any) -> Any:
        """value with every string in it (dict keys aside) escaped; lists, tuples and dicts
        are copied, anything else returned as it is."""
        strings: list[str] = []
        _collect(value, strings)
        if not strings:
            return value
        escaped = iter(self._escape_all(strings))
        return _rebuild(value, escaped)

    def _escape_all(self, strings: list[str]) -> list[str]:
        out = []
        for s in strings:
            if ESC in s:
                s = s.replace(ESC, ESC + _index_chars(0))
            if self._finder is not None:
                s = self._escape_specials(s)
            out.append(s)
        return out

    def _escape_specials(self, s: str) -> str:
        """s with each special token escaped, searched a window at a time: one regex call over
        a 60 MB prompt held the GIL (and the event loop) for 100 ms. s itself when it has none."""
        finder = self._finder
        assert finder is not None
        if len(s) <= _ESCAPE_WINDOW:
            return finder.sub(self._escape_match, s)
        out: list[str] = []
        start = 0  # s[start:] is not copied to out yet
        pos = 0
        while pos < len(s):
            end = min(len(s), pos + _ESCAPE_WINDOW)
            # A match starting before `decided` is whole within s[:end]; one starting later may
            # be a shorter token than the one the full text holds, so the next window decides it.
            decided = len(s) if end == len(s) else end - self._longest_special + 1
            for match in finder.finditer(s, pos, end):
                if match.start() >= decided:
                    break
                out += _slices(s, start, match.start())
                out.append(self._escape_match(match))
                start = match.end()
            pos = max(start, decided)
        if not out:
            return s
        out += _slices(s, start, len(s))
        return join_str(out)

    def _escape_match(self, match: re.Match[str]) -> str:
        return ESC + _index_chars(self._special[match.group()][1])

    # ---- encode: the rendered template ---------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The rendered (escaped) template's ids: its special tokens special, the rest plain."""
        pieces: list[str] = []
        markers: list[int] = []
        start = 0  # text[start:begin] is the piece before the marker at text[begin:end]
        for match in self._finder.finditer(text) if self._finder is not None else ():
            pieces.append(text[start : match.start()])
            markers.append(self._special[match.group()][0])
            start = match.end()
        pieces.append(text[start:])
        if ESC in text:
            pieces = [self.unescape(p) for p in pieces]
        encoded = self._plain.encode_batch_fast([p for p in pieces if p], add_special_tokens=False)
        ids: list[int] = []
        parts = iter(encoded)
        for i, piece in enumerate(pieces):
            if piece:
                ids += next(parts).ids
            if i < len(markers):
                ids.append(markers[i])
        return ids

    def unescape(self, text: str) -> str:
        """An escaped string as the client wrote it (an ESC without its digits stays)."""
        first, *rest = text.split(ESC)
        out = [first]
        for part in rest:
            index = _leading_index(part)
            if index is not None and index < len(self._contents):
                out += [self._contents[index], part[2:]]
            else:  # a template that cut an escape apart: keep what is there
                out += [ESC, part]
        return "".join(out)


def _slices(s: str, start: int, end: int) -> list[str]:
    """s[start:end] as slices of at most a window each: one slice of a 60 MB string would be
    one long copy under the GIL, these are short ones (join_str copies them without it)."""
    return [s[at : min(end, at + _ESCAPE_WINDOW)] for at in range(start, end, _ESCAPE_WINDOW)]


def _collect(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, Mapping):
        for v in value.values():
            _collect(v, out)
    elif isinstance(value, list | tuple):
        for v in value:
            _collect(v, out)


def _rebuild(value: Any, escaped: Iterator[str]) -> Any:
    """value with its strings taken in _collect's order from the escaped iterator."""
    if isinstance(value, str):
        return next(escaped)
    if isinstance(value, Mapping):
        return {k: _rebuild(v, escaped) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [_rebuild(v, escaped) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value

