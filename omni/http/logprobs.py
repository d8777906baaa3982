"""Logprobs in the API's shapes: chat (`content` entries), legacy completions, and vLLM's
prompt_logprobs.

A token is named by its own text (decoded alone, special tokens written out), or, with vLLM's
return_tokens_as_token_ids, as "token_id:N", which survives tokens that are not whole
characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omni.engines.generation import PromptLogprobs, TokenLogprob
from omni.serving.bodies import (
    ChatTokenLogprob,
    CompletionLogprobs,
    LogprobEntry,
    PromptTokenLogprob,
)
from omni.text.tokenizer import TextTokenizer


def token_text(tokenizer: TextTokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def token_name(tokenizer: TextTokenizer, token_id: int, as_token_ids: bool = False) -> str:
    return f"token_id:{token_id}" if as_token_ids else token_text(tokenizer, token_id)


def logprob_entry(tokenizer: TextTokenizer, token_id: int, logprob: float, as_token_ids: bool = False) -> LogprobEntry:
    name = token_name(tokenizer, token_id, as_token_ids)
    return LogprobEntry(name, logprob, list(name.encode("utf-8")))


def chat_logprob_entries(
    tokenizer: TextTokenizer, logprobs: Sequence[TokenLogprob], *, as_token_ids: bool = False
) -> list[ChatTokenLogprob]:
    """as_token_ids: the request's return_tokens_as_token_ids."""
    entries = []
    for lp in logprobs:
        name = token_name(tokenizer, lp.token_id, as_token_ids)
        top = [logprob_entry(tokenizer, t, v, as_token_ids) for t, v in lp.top]
        entries.append(ChatTokenLogprob(name, lp.logprob, list(name.encode("utf-8")), top))
    return entries


@dataclass(frozen=True, slots=True)
class OffsetToken:
    """One token of a completion's logprobs: its logprob (None for a prompt's first token,
    which nothing predicts), the alternatives at its position (None: not listed), and where
    its text starts in the choice's text."""

    token_id: int
    logprob: float | None
    top: Sequence[tuple[int, float]] | None
    text_offset: int


def completion_logprobs(
    tokenizer: TextTokenizer, tokens: Sequence[OffsetToken], *, as_token_ids: bool = False
) -> CompletionLogprobs:
    """The legacy completions' logprobs object. top_logprobs holds the token itself first,
    then the alternatives (OpenAI's "up to logprobs + 1"; vLLM's order)."""
    names: list[str] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float | None] | None] = []
    offsets: list[int] = []
    for t in tokens:
        names.append(token_name(tokenizer, t.token_id, as_token_ids))
        token_logprobs.append(t.logprob)
        top: dict[str, float | None] | None = None
        if t.logprob is not None and t.top is not None:
            top = {names[-1]: t.logprob}
            for token_id, logprob in t.top:
                top.setdefault(token_name(tokenizer, token_id, as_token_ids), logprob)
        tops.append(top)
        offsets.append(t.text_offset)
    return CompletionLogprobs(names, token_logprobs, tops, offsets)


def prompt_logprobs_json(
    tokenizer: TextTokenizer, prompt_logprobs: PromptLogprobs, num_top: int | None = None
) -> list[dict[str, PromptTokenLogprob] | None]:
    """vLLM's prompt_logprobs: None for the first prompt token, then per position a dict from
    token id (as a string) to {"logprob", "rank", "decoded_token"}: the prompt token first,
    then the num_top most likely tokens there (all the worker sent when None)."""
    out: list[dict[str, PromptTokenLogprob] | None] = []
    for entry in prompt_logprobs:
        if entry is None:
            out.append(None)
            continue
        position = {str(entry.token_id): _prompt_entry(tokenizer, entry.token_id, entry.logprob, entry.rank)}
        top = entry.top if num_top is None else entry.top[:num_top]
        for rank, (token_id, logprob) in enumerate(top, start=1):
            # The prompt token among them keeps its place first, with its rank from here.
            position[str(token_id)] = _prompt_entry(tokenizer, token_id, logprob, rank)
        out.append(position)
    return out


def _prompt_entry(tokenizer: TextTokenizer, token_id: int, logprob: float, rank: int) -> PromptTokenLogprob:
    return PromptTokenLogprob(logprob, rank, token_text(tokenizer, token_id))
