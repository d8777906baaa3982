"""What every endpoint's body shares: JSON readers, error helpers, the generation fields,
and sampling_params, which fits a parsed request to its prompt."""

from __future__ import annotations

import asyncio
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias, TypeVar

import orjson
from aiohttp import web

from omni.errors import APIError, bad_request
from omni.http.json_body import TooManyItems, decode_json, empty_in_steps
from omni.text.tokenizer import TextTokenizer
from scheduler.request import MediaSpan, SamplingParams

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


# Bodies larger than this are decoded, and parsed, in a worker thread: json_body.decode_json
# decodes them a window at a time (orjson holds the GIL for each of its calls, about 2.5 ms a
# megabyte of strings and 11 of small values on a small box), and parsing one is Python over
# every value it holds, seconds for hundreds of thousands of messages, which the loop shares
# through the GIL's switch interval instead of waiting out.
_DECODE_IN_THREAD_BYTES = 1 << 20
# What the body's stream buffers before readany() hands it over: each chunk is one short copy
# into the body's buffer (aiohttp's own read() raises this to the whole body, then copies the
# body it joined into bytes: 60 MB in one call).
_READ_CHUNK_BYTES = 256 * 1024

T = TypeVar("T")


async def read_json(request: web.Request, *, timeout: float | None = None) -> dict[str, Json]:
    """The request body as a JSON object. A body over client_max_size is a 413 (aiohttp's
    error); one that has not arrived within timeout seconds is a 408, and the connection is
    closed."""
    return await read_parsed(request, _as_is, timeout=timeout)


async def read_parsed(
    request: web.Request, parse: Callable[[dict[str, Json]], T], *, timeout: float | None = None
) -> T:
    """parse(the body as read_json reads it): in one worker thread with the decoding when the
    body is large, on the loop otherwise."""
    try:
        async with asyncio.timeout(timeout):
            raw = await _read_body(request)
    except TimeoutError:
        raise body_too_slow(timeout) from None
    if len(raw) > _DECODE_IN_THREAD_BYTES:
        return await asyncio.to_thread(_decode_and_parse, raw, parse, decode_json)
    return _decode_and_parse(raw, parse, orjson.loads)


def _as_is(body: dict[str, Json]) -> dict[str, Json]:
    return body


def _decode_and_parse(
    raw: bytearray, parse: Callable[[dict[str, Json]], T], decode: Callable[[bytearray], Any]
) -> T:
    try:
        data = decode(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"The request body is not valid JSON: {e}") from None
    except TooManyItems as e:
        raise bad_request(f"The request body is too large: {e}.", code="array_above_max_length") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    try:
        return parse(merge_extra_body(data))
    except BaseException:
        # Refused: nothing else holds the body, which the error's traceback would otherwise
        # free, wherever it ends, in one C call (8 million ids: ~250 ms with the GIL held).
        empty_in_steps(data)
        raise




async def _read_body(request: web.Request) -> bytearray:
    """The body in one buffer, grown chunk by chunk, so that no step copies the whole body:
    a large buffer grows in place (realloc remaps its pages), and preallocating it from
    Content-Length would zero-fill it all at once."""
    limit = request.client_max_size
    declared = request.content_length
    if limit and declared is not None and declared > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=declared)
    body = bytearray()
    stream = request.content
    stream.set_read_chunk_size(_READ_CHUNK_BYTES)
    while chunk := await stream.readany():
        body += chunk
        if limit and len(body) > limit:  # a compressed body inflates past Content-Length
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
    return body


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


# ----------------------------------------------------------------------------- headers

# A header, not a body field: it means the same on every endpoint, and neither OpenAI's nor
# vLLM's body has a field for it (the OpenAI client's own timeout never reaches the server).
REQUEST_TIMEOUT_HEADER = "X-Request-Timeout"


def request_timeout(request: web.Request) -> float | None:
    """The deadline the client asks for, in seconds from its prompt being ready; the server's
    --request-timeout caps it (ModelPool.admit)."""
    text = request.headers.get(REQUEST_TIMEOUT_HEADER)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0.0):
        raise bad_request(
            f"The {REQUEST_TIMEOUT_HEADER} header must be a positive number of seconds, got {text!r}.",
            code="invalid_header",
        )
    return value


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


# ----------------------------------------------------------------------------- fitting


def _check_in_vocabulary(param: str, token_ids: tuple[int, ...], vocab_size: int) -> None:
    bad = next((t for t in token_ids if t >= vocab_size), None)
    if bad is not None:
        raise value_error(
            param, f"token id {bad} is out of range for a vocabulary of {vocab_size}."
        )


def bad_words_token_ids(
    bad_words: tuple[str, ...], tokenizer: TextTokenizer
) -> tuple[tuple[int, ...], ...]:
    """Each bad word's token sequences, as vLLM makes them: the word as it would start the
    text, and also as it would follow a space when that gives a different first token in as
    many tokens (a word mid-text usually tokenizes with its leading space)."""
    sequences: list[tuple[int, ...]] = []
    for word in bad_words:
        bare = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        sequences.append(bare)
        if spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    return tuple(sequences)


def truncate_prompt(
    token_ids: list[int], request: GenerationFields, max_model_len: int
) -> list[int]:
    """The prompt's last truncate_prompt_tokens tokens (-1: the last max_model_len), as vLLM
    keeps them; the whole prompt when the request does not ask. For chat, call it on the
    rendered template's token ids (and move the media spans with truncated_media)."""
    limit = request.truncate_prompt_tokens
    if limit is None:
        return token_ids
    if limit == -1:
        limit = max_model_len
    return token_ids[-limit:] if len(token_ids) > limit else token_ids


def truncated_media(media: tuple[MediaSpan, ...], num_cut: int) -> tuple[MediaSpan, ...]:
    """The media spans of a prompt whose first num_cut tokens truncate_prompt dropped, at their
    new offsets. A span the cut goes through cannot be injected in part: a 400."""
    kept = []
    for span in media:
        if span.end <= num_cut:
            continue  # wholly cut: its item is not in the prompt any more
        if span.offset < num_cut:
            raise value_error(
                "truncate_prompt_tokens",
                f"keeping the last tokens would cut a media item's {span.num_rows} embedding rows "
                f"at prompt positions {span.offset}..{span.end - 1}; keep more tokens or none of it.",
            )
        kept.append(MediaSpan(span.offset - num_cut, span.num_rows, span.key))
    return tuple(kept)


def sampling_params(
    request: GenerationFields,
    *,
    num_prompt_tokens: int,
    max_model_len: int,
    tokenizer: TextTokenizer,
    stop_token_ids: tuple[int, ...] = (),
    max_logprobs: int = MAX_PROMPT_LOGPROBS,
) -> SamplingParams:
    """Fit the request to one prompt of num_prompt_tokens tokens and the model's vocabulary.

    The one place a request's sampling fields become the scheduler's SamplingParams.

    positions: 0 ........ num_prompt_tokens ........ max_model_len
               [ prompt  ][ at most max_model_len - num_prompt_tokens new tokens ]
    """
    prompt_param = request.prompt_param
    if num_prompt_tokens <= 0:
        raise value_error(prompt_param, "the prompt is empty (it encodes to no tokens).")
    room = max_model_len - num_prompt_tokens
    if room <= 0:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"{prompt_param} resulted in {num_prompt_tokens} tokens, which leaves no room for "
            f"the completion. Please reduce the length of the {prompt_param}.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    for field_name, asked in (
        (request.logprobs_param, request.num_logprobs),
        ("prompt_logprobs", request.num_prompt_logprobs),
    ):
        if asked is not None and asked > max_logprobs:
            raise bad_request(
                f"'{field_name}' asks for {asked} logprobs; this server gives at most {max_logprobs} "
                "(--max-logprobs).",
                param=field_name,
            )
    vocab_size = tokenizer.vocab_size
    _check_in_vocabulary("logit_bias", tuple(t for t, _ in request.logit_bias), vocab_size)
    _check_in_vocabulary("allowed_token_ids", request.allowed_token_ids or (), vocab_size)
    max_tokens = request.max_tokens
    if max_tokens is not None and max_tokens > room:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in "
            f"the {prompt_param}, {max_tokens} in the completion). Please reduce the "
            f"length of the {prompt_param} or the completion.",
            param=request.max_tokens_param,
            code="context_length_exceeded",
        )
    return SamplingParams(
        max_tokens=room if max_tokens is None else max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        seed=request.seed,
        logprobs=request.num_logprobs,
        stop_token_ids=request.stop_token_ids + stop_token_ids,
        ignore_eos=request.ignore_eos,
        min_tokens=request.min_tokens,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        repetition_penalty=request.repetition_penalty,
        logit_bias=request.logit_bias,
        min_p=request.min_p,
        allowed_token_ids=request.allowed_token_ids,
        bad_words_token_ids=bad_words_token_ids(request.bad_words, tokenizer),
        prompt_logprobs=request.num_prompt_logprobs,
    )
