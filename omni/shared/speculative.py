"""--speculative-config: vLLM's JSON for speculative decoding, read and checked in one place.

The server reads it at start (a bad value exits with status 2 naming what is wrong), the LLM
workers get the parsed setting in their spec, and the scheduler reads num_speculative_tokens.
Only model-free drafters are served (the worker proposes the drafts itself, next to its step,
in gpu_workers/spec/drafts.py):

- ngram: prompt lookup. The sequence's latest n-gram (n from prompt_lookup_max down to
  prompt_lookup_min) is looked for earlier in its prompt and output; the tokens that followed
  its latest earlier occurrence are the draft.
- suffix: suffix decoding (Arctic Inference's SuffixDecoding, gpu_workers/spec/suffix.py). The
  longest suffix of the sequence found in a suffix tree over the request's prompt and output,
  or in one over the outputs of the last suffix_decoding_max_cached_requests requests, is
  followed by its most frequent continuation while that stays likely enough
  (suffix_decoding_min_token_prob), for at most suffix_decoding_max_spec_factor times the
  match's length; the trees hold strings of up to suffix_decoding_max_tree_depth tokens.
  vLLM defaults num_speculative_tokens to the tree depth; here it is that, at most 15
  (MAX_SPECULATIVE_TOKENS): the suffix rules shorten drafts that are unlikely to hold.

Each method reads only its own keys; the other's are refused, and keep their defaults (vLLM's)
in SpeculativeConfig.

Standard library only: the server and the scheduler import it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_SPECULATIVE_TOKENS", "SERVED_METHODS", "SpeculativeConfig", "parse_speculative_config"]

SERVED_METHODS = ("ngram", "suffix")
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
# Each method's own keys, besides method, num_speculative_tokens and disable_by_batch_size.
_METHOD_KEYS = {
    "ngram": ("prompt_lookup_min", "prompt_lookup_max"),
    "suffix": (
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
    ),
}
# A suffix tree holds up to depth strings per token: deeper costs memory and a step's drafting
# time, and a draft is at most 15 tokens anyway.
MAX_SUFFIX_TREE_DEPTH = 64


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    # ngram's
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    # No drafts in a step while more than this many requests run (vLLM's disable_by_batch_size;
    # None: at any batch size).
    disable_by_batch_size: int | None = None
    # suffix's
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000  # 0: no global tree
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1

    def describe(self) -> str:
        """One line for the start-up log."""
        more = f", off above {self.disable_by_batch_size} running" if self.disable_by_batch_size else ""
        if self.method == "suffix":
            return (
                f"suffix, up to {self.num_speculative_tokens} draft tokens, trees {self.suffix_decoding_max_tree_depth} "
                f"deep over each request and the outputs of the last {self.suffix_decoding_max_cached_requests} "
                f"requests, drafts up to {self.suffix_decoding_max_spec_factor:g} x the match while likelier than "
                f"{self.suffix_decoding_min_token_prob:g}{more}"
            )
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


def _number(value: Any, key: str, low: float, high: float | None = None, *, above_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key} must be a number, got {value!r}")
    if value < low or (above_low and value == low) or (high is not None and value > high):
        bound = f"above {low:g}" if above_low else f"at least {low:g}"
        bound = f"in [{low:g}, {high:g}]" if high is not None else bound
        raise ValueError(f"{key} must be {bound}, got {value}")
    return float(value)


def parse_speculative_config(text: str) -> SpeculativeConfig:
    """vLLM's --speculative-config JSON as a SpeculativeConfig; ValueError saying what is wrong
    for malformed JSON, a method not served here, a missing, unknown or out-of-range key."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object")
    method = raw.get("method")
    if method is None:
        raise ValueError(f"method is required (served: {', '.join(SERVED_METHODS)})")
    method = str(method).strip().lower()
    if method == "[ngram]":  # vLLM's older spelling
        method = "ngram"
    if method not in SERVED_METHODS:
        why = "needs a draft model, which omni-serve does not load" if method in _MODEL_METHODS else "not a method omni-serve knows"
        raise ValueError(f"method {method!r}: {why} (served: {', '.join(SERVED_METHODS)})")
    known = {"method", "num_speculative_tokens", "disable_by_batch_size", *_METHOD_KEYS[method]}
    for key in raw:
        if key in _DRAFT_MODEL_KEYS:
            raise ValueError(f"{key}: only a draft model takes it, and {method} drafts without one")
        other = next((m for m, keys in _METHOD_KEYS.items() if key in keys and m != method), None)
        if other is not None:
            raise ValueError(f"{key}: only method {other} takes it, not {method}")
        if key not in known:
            raise ValueError(f"unknown key {key!r} (known: {', '.join(sorted(known))})")
    limit = raw.get("disable_by_batch_size")
    if limit is not None:
        limit = _int(limit, "disable_by_batch_size", 1)
    if method == "suffix":
        return _suffix_config(raw, limit)
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
    return SpeculativeConfig(method, k, low, high, limit)


def _suffix_config(raw: dict[str, Any], limit: int | None) -> SpeculativeConfig:
    """vLLM's defaults for the keys not given; num_speculative_tokens defaults to the tree
    depth (vLLM's), at most MAX_SPECULATIVE_TOKENS."""
    depth = raw.get("suffix_decoding_max_tree_depth", 24)
    depth = _int(depth, "suffix_decoding_max_tree_depth", 1, MAX_SUFFIX_TREE_DEPTH)
    k = raw.get("num_speculative_tokens", min(depth, MAX_SPECULATIVE_TOKENS))
    return SpeculativeConfig(
        "suffix",
        _int(k, "num_speculative_tokens", 1, MAX_SPECULATIVE_TOKENS),
        disable_by_batch_size=limit,
        suffix_decoding_max_tree_depth=depth,
        suffix_decoding_max_cached_requests=_int(
            raw.get("suffix_decoding_max_cached_requests", 10000), "suffix_decoding_max_cached_requests", 0
        ),
        suffix_decoding_max_spec_factor=_number(
            raw.get("suffix_decoding_max_spec_factor", 1.0), "suffix_decoding_max_spec_factor", 0.0, above_low=True
        ),
        suffix_decoding_min_token_prob=_number(
            raw.get("suffix_decoding_min_token_prob", 0.1), "suffix_decoding_min_token_prob", 0.0, 1.0
        ),
    )
