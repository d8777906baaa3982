"""What every endpoint's body shares: the error helpers, the field readers and the
generation fields (omni/serving/sampling.py fits them to a prompt)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from omni.errors import APIError, bad_request

MAX_N = 16
MAX_STOP_STRINGS = 4
# torch.Generator.manual_seed accepts exactly this range.
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound, either sign
# Any positive value is a penalty, but float32 logits divided by a tiny one overflow to inf:
# these bounds are far past any useful setting and keep the arithmetic finite.
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 1e-3, 1e3
# vLLM's default max_logprobs: the alternatives a prompt position may list.
MAX_PROMPT_LOGPROBS = 20
MAX_REQUEST_ID_LENGTH = 256

Json: TypeAlias = Any
Body: TypeAlias = Mapping[str, Json]




def merge_extra_body(data: dict[str, Json]) -> dict[str, Json]:
    """A literal "extra_body" object (what the OpenAI SDK merges into the body, sent as it is by
    some clients) is merged into the body; its keys win over top-level ones of the same name,
    as they would had the SDK merged them."""
    if "extra_body" not in data:
        return data
    extra = data.pop("extra_body")
    if extra is None:
        return data
    if not isinstance(extra, dict):
        raise type_error("extra_body", "an object", extra)
    return data | extra


# ----------------------------------------------------------------------------- errors


def _json_type(value: Json) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def type_error(param: str, expected: str, value: Json) -> APIError:
    return bad_request(
        f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead.",
        param=param,
        code="invalid_type",
    )


def value_error(param: str, detail: str) -> APIError:
    return bad_request(f"Invalid value for '{param}': {detail}", param=param, code="invalid_value")


def unsupported(param: str, detail: str) -> APIError:
    return bad_request(
        f"'{param}' is not supported: {detail}", param=param, code="unsupported_parameter"
    )


def body_too_slow(timeout: float | None) -> APIError:
    """A body that did not arrive within --body-timeout: a 408, and the connection is closed."""
    return APIError(
        408,
        f"The request body did not arrive within {timeout or 0:g} seconds.",
        code="request_timeout",
        headers={"Connection": "close"},
    )


def check_known_fields(body: Mapping[str, object], known: frozenset[str], path: str) -> None:
    """A field the endpoint does not know is a 400 naming it (the first, in name order)."""
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad_request(
            f"Unrecognized request argument supplied: '{unknown[0]}' is not a field of {path}.",
            param=unknown[0],
            code="unknown_parameter",
        )


def missing(param: str) -> APIError:
    return bad_request(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


# ----------------------------------------------------------------------------- field readers


def opt_bool(body: Body, key: str, param: str | None = None) -> bool | None:
    value = body.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise type_error(param or key, "a boolean", value)


def opt_str(body: Body, key: str, param: str | None = None) -> str | None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return value
    raise type_error(param or key, "a string", value)


def opt_int(
    body: Body, key: str, *, lo: int | None = None, hi: int | None = None, param: str | None = None
) -> int | None:
    value = body.get(key)
    param = param or key
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise type_error(param, "an integer", value)
    if lo is not None and value < lo or hi is not None and value > hi:
        if hi is None:
            raise value_error(param, f"must be at least {lo}, got {value}.")
        if lo is None:
            raise value_error(param, f"must be at most {hi}, got {value}.")
        raise value_error(param, f"must be between {lo} and {hi}, got {value}.")
    return value


def opt_number(body: Body, key: str, param: str | None = None) -> float | None:
    value = body.get(key)
    param = param or key
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise type_error(param, "a number", value)
    if not math.isfinite(value):
        raise value_error(param, "must be a finite number.")
    return float(value)


def required_str(body: Body, key: str, param: str | None = None) -> str:
    param = param or key
    if key not in body or body[key] is None:
        raise missing(param)
    value = body[key]
    if not isinstance(value, str):
        raise type_error(param, "a string", value)
    return value


def opt_object(body: Body, key: str) -> Mapping[str, Json] | None:
    value = body.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise type_error(key, "an object", value)


# ----------------------------------------------------------------------------- shared fields


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationFields(ABC):
    """The fields both endpoints share, validated but not yet fitted to a prompt."""

    # None: as many as the context allows.
    max_tokens: int | None = None
    # The field max_tokens came from, to name it in a context-length error.
    max_tokens_param: str = "max_tokens"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    # Extensions (as in vLLM).
    # Every streamed chunk carries the usage so far (stream_options.continuous_usage_stats;
    # only with include_usage, as in vLLM).
    continuous_usage: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False  # a matched stop string stays in the text
    return_tokens_as_token_ids: bool = False  # logprob tokens read "token_id:N"
    # Keep only the last N prompt tokens; -1: the model's max_model_len (truncate_prompt).
    truncate_prompt_tokens: int | None = None
    # vLLM's prompt_logprobs: None, or the alternatives listed per prompt position. Never
    # with stream beyond 0 (refused) and never streamed, as in vLLM.
    prompt_logprobs: int | None = None
    request_id: str | None = None  # the client's id for the request: the response id's tail
    # Logit processors: OpenAI's penalties and logit_bias, vLLM's others (SamplingParams
    # says what each does). Token ids are checked against the vocabulary in sampling_params.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), sorted by id
    min_p: float = 0.0
    min_tokens: int = 0
    allowed_token_ids: tuple[int, ...] | None = None  # None: no restriction
    bad_words: tuple[str, ...] = ()  # tokenized in sampling_params
    thinking_token_budget: int | None = None  # reasoning tokens at most, then </think> is forced

    # Names the prompt in context-length errors; each endpoint's request sets it.
    prompt_param: ClassVar[str]
    logprobs_param: ClassVar[str]

    # Abstract because each endpoint spells logprobs its own way (a flag and a count, or a count).
    @property
    @abstractmethod
    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None, or how many alternatives besides the sampled token."""

    @property
    def num_prompt_logprobs(self) -> int | None:
        """SamplingParams.prompt_logprobs: what the response will show of the prompt (nothing
        of it in a stream)."""
        return None if self.stream else self.prompt_logprobs


def _parse_stop(body: Body) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list):
        raise type_error("stop", "a string or an array of strings", value)
    if len(stops) > MAX_STOP_STRINGS:
        raise value_error(
            "stop", f"at most {MAX_STOP_STRINGS} stop sequences are allowed, got {len(stops)}."
        )
    for s in stops:
        if not isinstance(s, str):
            raise type_error("stop", "a string or an array of strings", s)
        if not s:
            raise value_error("stop", "stop sequences must not be empty.")
    return tuple(stops)


def _parse_stop_token_ids(body: Body) -> tuple[int, ...]:
    value = body.get("stop_token_ids")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise type_error("stop_token_ids", "an array of non-negative integers", value)
    return tuple(value)


def _parse_logit_bias(body: Body) -> tuple[tuple[int, float], ...]:
    value = opt_object(body, "logit_bias")
    if not value:
        return ()
    biases: dict[int, float] = {}
    for key, bias in value.items():
        # isascii: str.isdigit() also accepts digits like "²", which int() refuses
        if not (key.isascii() and key.isdigit()):
            raise value_error("logit_bias", f"keys must be token ids, got {key!r}.")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise type_error("logit_bias", "an object of numbers", bias)
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise value_error("logit_bias", f"biases must be between -100 and 100, got {bias}.")
        token_id = int(key)
        if token_id in biases:  # "5" and "05"
            raise value_error("logit_bias", f"token id {token_id} appears more than once.")
        biases[token_id] = float(bias)
    return tuple(sorted(biases.items()))


def _parse_allowed_token_ids(body: Body) -> tuple[int, ...] | None:
    value = body.get("allowed_token_ids")
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise type_error("allowed_token_ids", "an array of non-negative integers", value)
    if not value:
        raise value_error("allowed_token_ids", "must name at least one token.")
    return tuple(sorted(set(value)))


def _parse_bad_words(body: Body) -> tuple[str, ...]:
    value = body.get("bad_words")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise type_error("bad_words", "an array of strings", value)
    if any(not w.strip() for w in value):
        raise value_error("bad_words", "bad words must not be empty or only whitespace.")
    return tuple(value)


def _opt_range(body: Body, key: str, lo: float, hi: float) -> float | None:
    value = opt_number(body, key)
    if value is not None and not lo <= value <= hi:
        raise value_error(key, f"must be between {lo:g} and {hi:g}, got {value:g}.")
    return value


def _parse_prompt_logprobs(body: Body, stream: bool) -> int | None:
    if body.get("prompt_logprobs") == -1:  # vLLM's "the whole vocabulary"
        raise value_error(
            "prompt_logprobs",
            f"the whole vocabulary (-1) is not available; ask for at most {MAX_PROMPT_LOGPROBS}.",
        )
    value = opt_int(body, "prompt_logprobs", lo=0, hi=MAX_PROMPT_LOGPROBS)
    if value and stream:
        raise bad_request(
            "'prompt_logprobs' are not available when 'stream' is true.", param="prompt_logprobs"
        )
    return value


def _parse_truncate_prompt_tokens(body: Body) -> int | None:
    value = opt_int(body, "truncate_prompt_tokens")
    if value is not None and value < 1 and value != -1:
        raise value_error(
            "truncate_prompt_tokens",
            f"must be at least 1, or -1 for the model's maximum context length, got {value}.",
        )
    return value


def _parse_request_id(body: Body) -> str | None:
    value = opt_str(body, "request_id")
    if value is None:
        return None
    if not 0 < len(value) <= MAX_REQUEST_ID_LENGTH or not value.isprintable():
        raise value_error(
            "request_id",
            f"must be 1 to {MAX_REQUEST_ID_LENGTH} printable characters, got {len(value)} characters.",
        )
    return value


def parse_generation_fields(body: Body, *, zero_max_tokens: bool = False) -> dict[str, Json]:
    """GenerationFields' values, as keyword arguments for a request class.

    zero_max_tokens: max_tokens may be 0 (completions' echo: the prompt alone, scored)."""
    max_tokens_param = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    lo = 0 if zero_max_tokens else 1
    max_tokens = opt_int(body, max_tokens_param, lo=lo)
    if max_tokens_param == "max_completion_tokens":
        opt_int(body, "max_tokens", lo=lo)  # still validated; max_completion_tokens wins

    temperature = opt_number(body, "temperature")
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        raise value_error("temperature", f"must be between 0 and 2, got {temperature}.")
    top_p = opt_number(body, "top_p")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise value_error("top_p", f"must be greater than 0 and at most 1, got {top_p}.")
    top_k = opt_int(body, "top_k", lo=-1)
    presence_penalty = _opt_range(body, "presence_penalty", -2.0, 2.0)
    frequency_penalty = _opt_range(body, "frequency_penalty", -2.0, 2.0)
    repetition_penalty = _opt_range(body, "repetition_penalty", MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY)
    min_p = _opt_range(body, "min_p", 0.0, 1.0)
    min_tokens = opt_int(body, "min_tokens", lo=0)
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise value_error(
            "min_tokens", f"must be at most {max_tokens_param} ({max_tokens}), got {min_tokens}."
        )

    stream = bool(opt_bool(body, "stream"))
    include_usage = continuous_usage = False
    options = opt_object(body, "stream_options")
    if options is not None:
        if not stream:
            raise bad_request(
                "'stream_options' is only allowed when 'stream' is true.", param="stream_options"
            )
        param = "stream_options.include_usage"
        include_usage = bool(opt_bool(options, "include_usage", param))
        param = "stream_options.continuous_usage_stats"
        continuous_usage = include_usage and bool(opt_bool(options, "continuous_usage_stats", param))
    n = opt_int(body, "n", lo=1, hi=MAX_N)

    return {
        "max_tokens": max_tokens,
        "max_tokens_param": max_tokens_param,
        "temperature": 1.0 if temperature is None else temperature,
        "top_p": 1.0 if top_p is None else top_p,
        "top_k": top_k if top_k is not None and top_k > 0 else None,  # -1 and 0 mean "off"
        "seed": opt_int(body, "seed", lo=MIN_SEED, hi=MAX_SEED),
        "stop": _parse_stop(body),
        "n": 1 if n is None else n,
        "stream": stream,
        "include_usage": include_usage,
        "continuous_usage": continuous_usage,
        "ignore_eos": bool(opt_bool(body, "ignore_eos")),
        "skip_special_tokens": opt_bool(body, "skip_special_tokens") is not False,
        "stop_token_ids": _parse_stop_token_ids(body),
        "include_stop_str_in_output": bool(opt_bool(body, "include_stop_str_in_output")),
        "return_tokens_as_token_ids": bool(opt_bool(body, "return_tokens_as_token_ids")),
        "truncate_prompt_tokens": _parse_truncate_prompt_tokens(body),
        "prompt_logprobs": _parse_prompt_logprobs(body, stream),
        "request_id": _parse_request_id(body),
        "presence_penalty": presence_penalty or 0.0,
        "frequency_penalty": frequency_penalty or 0.0,
        "repetition_penalty": 1.0 if repetition_penalty is None else repetition_penalty,
        "logit_bias": _parse_logit_bias(body),
        "min_p": min_p or 0.0,
        "min_tokens": min_tokens or 0,
        "allowed_token_ids": _parse_allowed_token_ids(body),
        "bad_words": _parse_bad_words(body),
        "thinking_token_budget": opt_int(body, "thinking_token_budget", lo=0),
    }


