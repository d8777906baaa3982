"""Reasoning in generated text: a `<think>...</think>` block at the start of the output.

    "<think>\\nweigh the options\\n</think>\\n\\nThe answer."
            |--- reasoning ---|            |-content-|

Whitespace at either end of the reasoning and right after `</think>` belongs to neither part:
the reference model (like DeepSeek-R1 and Qwen3) writes newlines there as layout. A block is
recognized only at the start of the output (after whitespace), or from the first token when
the prompt already opened it; a `<think>` later on is content. Output that ends inside the block
is all reasoning. An empty block is no reasoning (None), so a client sees no empty field.

parse() and the streaming push()/finish() agree for any chunking of the same text.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import ClassVar, Protocol

# How far back from the prompt's end an open <think> is looked for (it is followed by at most
# a newline or two).
_PROMPT_TAIL_TOKENS = 4


class _State(enum.Enum):
    START = "start"  # before the first non-whitespace text: a block may still open
    REASONING = "reasoning"
    CONTENT = "content"


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of text that is a proper beginning of marker."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    name: ClassVar[str] = "think"
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    markup_tokens: ClassVar[tuple[str, ...]] = ("<think>", "</think>")

    def __init__(self, *, in_reasoning: bool = False) -> None:
        """in_reasoning: the prompt ends inside an open block (the chat template opened it)."""
        self.in_reasoning = in_reasoning
        self._state = _State.REASONING if in_reasoning else _State.START
        self._buffer = ""  # text held back: a possible marker, or whitespace that may be trimmed
        self._skip_space = in_reasoning  # leading whitespace of the current part is dropped

    def parse(self, text: str) -> tuple[str | None, str]:
        """The whole output -> (reasoning, or None when there was none; content)."""
        if not self.in_reasoning:
            rest = text.lstrip()
            if not rest.startswith(self.start):
                return None, text
            text = rest[len(self.start) :]
        i = text.find(self.end)
        if i < 0:
            return text.lstrip() or None, ""
        return text[:i].strip() or None, text[i + len(self.end) :].lstrip()

    def push(self, text: str) -> tuple[str, str]:
        """The next piece of output -> (reasoning to send now, content to send now)."""
        self._buffer += text
        reasoning: list[str] = []
        content: list[str] = []
        while True:
            if self._state is _State.START:
                rest = self._buffer.lstrip()
                if self.start.startswith(rest) and rest != self.start:  # whitespace, or part of the marker
                    break
                if rest.startswith(self.start):
                    self._buffer = rest[len(self.start) :]
                    self._state, self._skip_space = _State.REASONING, True
                else:
                    self._state = _State.CONTENT
                continue
            if self._skip_space:
                self._buffer = self._buffer.lstrip()
                if not self._buffer:
                    break
                self._skip_space = False
            if self._state is _State.CONTENT:
                content.append(self._buffer)
                self._buffer = ""
                break
            i = self._buffer.find(self.end)
            if i >= 0:
                reasoning.append(self._buffer[:i].rstrip())
                self._buffer = self._buffer[i + len(self.end) :]
                self._state, self._skip_space = _State.CONTENT, True
                continue
            held = _partial_suffix(self._buffer, self.end)
            ready = self._buffer[: len(self._buffer) - held]
            body = ready.rstrip()  # whitespace is sent only once more reasoning follows it
            reasoning.append(body)
            self._buffer = self._buffer[len(body) :]
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """End of output: what was held back goes to the part it was in."""
        held, self._buffer = self._buffer, ""
        if self._state is _State.REASONING:
            return held, ""
        return "", held


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "think": ReasoningParser,
    "deepseek_r1": ReasoningParser,
    "qwen3": ReasoningParser,
    "hyperclovax": ReasoningParser,
}


def reasoning_parser_class(name: str) -> type[ReasoningParser]:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}") from None


class Decoder(Protocol):
    """What reading a prompt's tail takes of a tokenizer (omni/text/tokenizer.py TextTokenizer);
    the parsers import nothing outside the standard library and themselves."""

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...


def prompt_opens_reasoning(tokenizer: Decoder, parser: str, prompt_token_ids: Sequence[int]) -> bool:
    """The template ended the prompt inside an open reasoning block (Qwen3 and R1 style)."""
    cls = reasoning_parser_class(parser)
    tail = tokenizer.decode(prompt_token_ids[-_PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
    return tail.rstrip().endswith(cls.start)
