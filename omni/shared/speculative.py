"""--speculative-config: vLLM's JSON for speculative decoding, read and checked in one place.

The server reads it at start (a bad value exits with status 2 naming what is wrong), the LLM
workers get the parsed setting in their spec, and the scheduler reads num_speculative_tokens.
Only model-free drafters are served (the worker proposes the drafts itself, next to its step):

- ngram: prompt lookup. The sequence's latest n-gram (n from prompt_lookup_max down to
  prompt_lookup_min) is looked for earlier in its prompt and output; the tokens that followed
  its latest earlier occurrence are the draft (gpu_workers/spec/ngram.py).

Standard library only: the server and the scheduler import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_SPECULATIVE_TOKENS", "SERVED_METHODS", "SpeculativeConfig", "parse_speculative_config"]

SERVED_METHODS = ("ngram",)
# Draft tokens a step may verify per request: the worker's native decode takes up to 8 rows.
MAX_SPECULATIVE_TOKENS = 15

# vLLM's methods that need a draft model (or heads) this server does not load.
_MODEL_METHODS = ("eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "mtp", "deepseek_mtp")
# vLLM keys that only mean something for a draft model: refused with the reason.
_DRAFT_MODEL_KEYS = (
    "model",
    "quantization",
    "draft_tensor_parallel_size",
    "max_model_len",
    "revision",
    "code_revision",
    "speculative_token_tree",
    "target_model_config",
    "draft_model_config",
    "parallel_drafting",
)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int
    # No drafts in a step while more than this many requests run (vLLM's disable_by_batch_size;
    # None: at any batch size).
    disable_by_batch_size: int | None = None

    def describe(self) -> str:
        """One line for the start-up log."""
        more = f", off above {self.disable_by_batch_size} running" if self.disable_by_batch_size else ""
        return (
            f"{self.method}, {self.num_speculative_tokens} draft tokens, n-grams of "
            f"{self.prompt_lookup_min}-{self.prompt_lookup_max} tokens{more}"
        )


def _int(value: Any, key: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f"at least {low}"
        raise ValueError(f"{key} must be {bound}, got {value}")
    return value


def parse_speculative_config(text: str) -> SpeculativeConfig:
    """vLLM's --speculative-config JSON as a SpeculativeConfig; ValueError saying what is wrong
    for malformed JSON, a method not served here, a missing, unknown or out-of-range key."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object")
    known = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size"}
    method = raw.get("method")
    if method is None:
        raise ValueError(f"method is required (served: {', '.join(SERVED_METHODS)})")
    method = str(method).strip().lower()
    if method == "[ngram]":  # vLLM's older spelling
        method = "ngram"
    if method not in SERVED_METHODS:
        why = "needs a draft model, which omni-serve does not load" if method in _MODEL_METHODS else "not a method omni-serve knows"
        raise ValueError(f"method {method!r}: {why} (served: {', '.join(SERVED_METHODS)})")
    for key in raw:
        if key in _DRAFT_MODEL_KEYS:
            raise ValueError(f"{key}: only a draft model takes it, and {method} drafts without one")
        if key not in known:
            raise ValueError(f"unknown key {key!r} (known: {', '.join(sorted(known))})")
    if "num_speculative_tokens" not in raw:
        raise ValueError("num_speculative_tokens is required")
    k = _int(raw["num_speculative_tokens"], "num_speculative_tokens", 1, MAX_SPECULATIVE_TOKENS)
    low, high = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
    # vLLM's defaults: 5 and 5 with neither given, else the one given for both
    if low is None and high is None:
        low = high = 5
    low = high if low is None else low
    high = low if high is None else high
    low = _int(low, "prompt_lookup_min", 1)
    high = _int(high, "prompt_lookup_max", 1)
    if low > high:
        raise ValueError(f"prompt_lookup_min ({low}) must not exceed prompt_lookup_max ({high})")
    limit = raw.get("disable_by_batch_size")
    if limit is not None:
        limit = _int(limit, "disable_by_batch_size", 1)
    return SpeculativeConfig(method, k, low, high, limit)
