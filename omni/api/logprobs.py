"""Logprobs in the two OpenAI shapes: chat (`content` entries) and legacy completions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omni.generation import TokenLogprob
from omni.tokenizer import TextTokenizer


def _token_text(tokenizer: TextTokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _token_entry(tokenizer: TextTokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = _token_text(tokenizer, token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprob_entries(
    tokenizer: TextTokenizer, logprobs: Sequence[TokenLogprob]
) -> list[dict[str, Any]]:
    entries = []
    for lp in logprobs:
        entry = _token_entry(tokenizer, lp.token_id, lp.logprob)
        entry["top_logprobs"] = [_token_entry(tokenizer, t, v) for t, v in lp.top]
        entries.append(entry)
    return entries


def completion_logprobs(
    tokenizer: TextTokenizer, logprobs: Sequence[TokenLogprob], text_offset: int
) -> dict[str, Any]:
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = text_offset
    for lp in logprobs:
        text = _token_text(tokenizer, lp.token_id)
        tokens.append(text)
        token_logprobs.append(lp.logprob)
        tops.append({_token_text(tokenizer, t): v for t, v in lp.top} if lp.top else None)
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }
