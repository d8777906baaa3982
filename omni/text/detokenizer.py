"""Turn a stream of generated token ids into text deltas, and stop at stop strings.

Two layers:
- decoding: ids -> text. For byte-level tokenizers each id maps to fixed bytes, so an
  incremental UTF-8 decoder gives exactly tokenizer.decode(all ids) with O(new bytes) work per
  token and holds back an incomplete character until its last byte arrives. Other tokenizers
  use vLLM's prefix/read offsets: decode a short window and emit what it adds.
- stop strings: text that could still become a stop string is held back, so a stop string is
  never partly emitted, and nothing after one is (the stop string itself only when asked).

Whatever is held back, the text emitted is always a prefix of the text decoded so far, so a
token's offset in the decoded text (num_decoded_chars before it was pushed) is its offset in
the text the client gets: text[offset[i]:offset[i + 1]] is what token i added.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from omni.text.tokenizer import TextTokenizer

# Prompt tokens the offset decoder keeps as left context (vLLM uses the same few).
_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class _ByteLevelDecoder:
    def __init__(
        self, tokenizer: TextTokenizer, skip_special_tokens: bool, keep_special: frozenset[int]
    ) -> None:
        self._table = tokenizer.token_bytes(
            skip_special_tokens=skip_special_tokens, keep_special=keep_special
        )
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Sequence[int]) -> str:
        table = self._table
        n = len(table)
        # Ids outside the vocabulary decode to nothing, as in the Rust decode.
        data = b"".join(table[i] if 0 <= i < n else b"" for i in token_ids)
        return self._utf8.decode(data)

    def finish(self) -> str:
        # Bytes of a character that never completed become U+FFFD, as in the full decode.
        return self._utf8.decode(b"", final=True)


class _OffsetDecoder:
    """vLLM's scheme: text(ids[prefix:]) minus text(ids[prefix:read]) is the new text.

    ids:  ... | prefix_offset ........ | read_offset ........ | end
              [ already emitted, kept ][ not yet emitted     ]
              only as left context
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool,
        keep_special: frozenset[int],
    ) -> None:
        self._tokenizer = tokenizer
        # Skipped specials are dropped from the ids and the rest decoded with every special
        # written out: the same text as a skipping decode, but keep_special survives.
        self._drop = tokenizer.skipped_special_ids(keep_special) if skip_special_tokens else frozenset()
        self._ids = [t for t in prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:] if t not in self._drop]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=False)

    def push(self, token_ids: Sequence[int]) -> str:
        self._ids.extend(t for t in token_ids if t not in self._drop)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            # Nothing new yet, or the last character is incomplete: wait for more ids.
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def finish(self) -> str:
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: TextTokenizer,
        prompt_token_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
        keep_special: frozenset[int] = frozenset(),
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
    ) -> None:
        """keep_special: special token ids written out even when the others are skipped.
        include_stop_str_in_output: a stop string that is hit ends the text instead of being cut."""
        self._decoder: _ByteLevelDecoder | _OffsetDecoder
        if tokenizer.is_byte_level:
            self._decoder = _ByteLevelDecoder(tokenizer, skip_special_tokens, keep_special)
        else:
            self._decoder = _OffsetDecoder(tokenizer, prompt_token_ids, skip_special_tokens, keep_special)
        self._stop = tuple(s for s in stop if s)
        self._include_stop = include_stop_str_in_output
        # Decoded text not yet emitted because it ends with the start of a stop string.
        self._held = ""
        self.stop_reason: str | None = None
        # Characters decoded so far, stop strings aside: where the next token's text starts.
        self.num_decoded_chars = 0

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def push(self, token_ids: Sequence[int]) -> str:
        """Take newly generated ids; return the text they complete (maybe "")."""
        if self.stopped:
            return ""
        text = self._decoder.push(token_ids)
        self.num_decoded_chars += len(text)
        return self._emit(text, final=False)

    def finish(self) -> str:
        """The request ended: return the text held back so far."""
        if self.stopped:
            return ""
        text = self._decoder.finish()
        self.num_decoded_chars += len(text)
        return self._emit(text, final=True)

    def _emit(self, text: str, *, final: bool) -> str:
        if not self._stop:
            return text
        # A stop string that starts in already emitted text is impossible: its start was
        # held back. So searching the held text plus the new text is enough.
        held = self._held + text
        hit_at, hit = len(held), None
        for s in self._stop:
            i = held.find(s, 0, hit_at + len(s))
            if i != -1 and i < hit_at:
                hit_at, hit = i, s
        if hit is not None:
            self.stop_reason = hit
            self._held = ""
            return held[: hit_at + len(hit)] if self._include_stop else held[:hit_at]
        keep = 0 if final else self._partial_stop_suffix(held)
        self._held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep]

    def _partial_stop_suffix(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop string."""
        longest = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest


def token_offsets(
    tokenizer: TextTokenizer,
    token_ids: Sequence[int],
    *,
    skip_special_tokens: bool,
    keep_special: frozenset[int] = frozenset(),
) -> tuple[str, list[int]]:
    """The text of token_ids, decoded incrementally as a generation's are, and where each
    token's text starts in it (an echoed prompt's text_offset)."""
    detok = IncrementalDetokenizer(
        tokenizer, skip_special_tokens=skip_special_tokens, keep_special=keep_special
    )
    parts: list[str] = []
    offsets: list[int] = []
    for token_id in token_ids:
        offsets.append(detok.num_decoded_chars)
        parts.append(detok.push([token_id]))
    parts.append(detok.finish())
    return "".join(parts), offsets
