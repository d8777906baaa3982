"""Request bodies of the OpenAI API, validated into frozen dataclasses.

Parsing works on already-decoded JSON (read_json reads one from a request). Every
error is a 400 APIError whose param names the offending field, e.g. "messages[1].content".
Fields this server does not know are ignored, as OpenAI clients send many; known fields it
cannot honour (penalties, logit_bias, echo, ...) are rejected rather than silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

import orjson
from aiohttp import web

from omni.api.errors import APIError, bad_request
from scheduler.request import SamplingParams

MAX_N = 16
MAX_STOP_STRINGS = 4
MAX_TOP_LOGPROBS = 20  # chat completions
MAX_COMPLETION_LOGPROBS = 5  # legacy completions
# torch.Generator.manual_seed accepts exactly this range.
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MODALITIES = frozenset({"text", "image", "audio"})
AUDIO_FORMATS = frozenset({"wav", "mp3", "flac", "opus", "pcm16", "aac"})

Json: TypeAlias = Any
Body: TypeAlias = Mapping[str, Json]


async def read_json(request: web.Request) -> dict[str, Json]:
    """The request body as a JSON object; a body over client_max_size raises 413 (aiohttp)."""
    raw = await request.read()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"The request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    return data


# ----------------------------------------------------------------------------- field readers


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


def _type_error(param: str, expected: str, value: Json) -> APIError:
    return bad_request(
        f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead.",
        param=param,
        code="invalid_type",
    )


def _value_error(param: str, detail: str) -> APIError:
    return bad_request(f"Invalid value for '{param}': {detail}", param=param, code="invalid_value")


def _unsupported(param: str, detail: str) -> APIError:
    return bad_request(
        f"'{param}' is not supported: {detail}", param=param, code="unsupported_parameter"
    )


def _missing(param: str) -> APIError:
    return bad_request(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _opt_bool(body: Body, key: str, param: str | None = None) -> bool | None:
    value = body.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise _type_error(param or key, "a boolean", value)


def _opt_str(body: Body, key: str, param: str | None = None) -> str | None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _type_error(param or key, "a string", value)


def _opt_int(body: Body, key: str, *, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(key, "an integer", value)
    if lo is not None and value < lo or hi is not None and value > hi:
        if hi is None:
            raise _value_error(key, f"must be at least {lo}, got {value}.")
        if lo is None:
            raise _value_error(key, f"must be at most {hi}, got {value}.")
        raise _value_error(key, f"must be between {lo} and {hi}, got {value}.")
    return value


def _opt_number(body: Body, key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(key, "a number", value)
    if not math.isfinite(value):
        raise _value_error(key, "must be a finite number.")
    return float(value)


def _required_str(body: Body, key: str, param: str | None = None) -> str:
    param = param or key
    if key not in body or body[key] is None:
        raise _missing(param)
    value = body[key]
    if not isinstance(value, str):
        raise _type_error(param, "a string", value)
    return value


def _opt_object(body: Body, key: str) -> Mapping[str, Json] | None:
    value = body.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise _type_error(key, "an object", value)


# ----------------------------------------------------------------------------- shared fields


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationFields:
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
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: tuple[int, ...] = ()


def _parse_stop(body: Body) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list):
        raise _type_error("stop", "a string or an array of strings", value)
    if len(stops) > MAX_STOP_STRINGS:
        raise _value_error(
            "stop", f"at most {MAX_STOP_STRINGS} stop sequences are allowed, got {len(stops)}."
        )
    for s in stops:
        if not isinstance(s, str):
            raise _type_error("stop", "a string or an array of strings", s)
        if not s:
            raise _value_error("stop", "stop sequences must not be empty.")
    return tuple(stops)


def _parse_stop_token_ids(body: Body) -> tuple[int, ...]:
    value = body.get("stop_token_ids")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise _type_error("stop_token_ids", "an array of non-negative integers", value)
    return tuple(value)


def _parse_generation_fields(body: Body) -> dict[str, Json]:
    """GenerationFields' values, as keyword arguments for a request class."""
    max_tokens_param = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = _opt_int(body, max_tokens_param, lo=1)
    if max_tokens_param == "max_completion_tokens":
        _opt_int(body, "max_tokens", lo=1)  # still validated; max_completion_tokens wins

    temperature = _opt_number(body, "temperature")
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        raise _value_error("temperature", f"must be between 0 and 2, got {temperature}.")
    top_p = _opt_number(body, "top_p")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise _value_error("top_p", f"must be greater than 0 and at most 1, got {top_p}.")
    top_k = _opt_int(body, "top_k", lo=-1)
    for key in ("presence_penalty", "frequency_penalty"):
        penalty = _opt_number(body, key)
        if penalty is not None and not -2.0 <= penalty <= 2.0:
            raise _value_error(key, f"must be between -2 and 2, got {penalty}.")
        if penalty:
            raise _unsupported(key, "this server only accepts 0.")
    repetition_penalty = _opt_number(body, "repetition_penalty")
    if repetition_penalty is not None and repetition_penalty != 1.0:
        raise _unsupported("repetition_penalty", "this server only accepts 1.")
    if _opt_object(body, "logit_bias"):
        raise _unsupported("logit_bias", "this server does not apply logit biases.")

    stream = bool(_opt_bool(body, "stream"))
    include_usage = False
    options = _opt_object(body, "stream_options")
    if options is not None:
        if not stream:
            raise bad_request(
                "'stream_options' is only allowed when 'stream' is true.", param="stream_options"
            )
        param = "stream_options.include_usage"
        include_usage = bool(_opt_bool(options, "include_usage", param))
    n = _opt_int(body, "n", lo=1, hi=MAX_N)

    return {
        "max_tokens": max_tokens,
        "max_tokens_param": max_tokens_param,
        "temperature": 1.0 if temperature is None else temperature,
        "top_p": 1.0 if top_p is None else top_p,
        "top_k": top_k if top_k is not None and top_k > 0 else None,  # -1 and 0 mean "off"
        "seed": _opt_int(body, "seed", lo=MIN_SEED, hi=MAX_SEED),
        "stop": _parse_stop(body),
        "n": 1 if n is None else n,
        "stream": stream,
        "include_usage": include_usage,
        "ignore_eos": bool(_opt_bool(body, "ignore_eos")),
        "skip_special_tokens": _opt_bool(body, "skip_special_tokens") is not False,
        "stop_token_ids": _parse_stop_token_ids(body),
    }


# ----------------------------------------------------------------------------- chat


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ImageURLPart:
    url: str  # http(s) URL or data: URL; fetching and size limits are the media layer's job
    detail: str | None = None
    type: Literal["image_url"] = "image_url"


@dataclass(frozen=True, slots=True)
class InputAudioPart:
    data: str  # base64
    format: str
    type: Literal["input_audio"] = "input_audio"


@dataclass(frozen=True, slots=True)
class VideoURLPart:
    url: str
    type: Literal["video_url"] = "video_url"


ContentPart: TypeAlias = TextPart | ImageURLPart | InputAudioPart | VideoURLPart


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    # None only for an assistant turn (e.g. one that only made tool calls).
    content: str | tuple[ContentPart, ...] | None
    name: str | None = None
    tool_call_id: str | None = None
    # Passed through to the chat template unchanged.
    tool_calls: tuple[Mapping[str, Json], ...] = ()

    @property
    def text(self) -> str:
        """The message's text parts joined; media parts contribute nothing."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    def to_template_dict(self) -> dict[str, Json]:
        """The message as a chat template expects it; media parts become typed dicts."""
        content: Json
        if self.content is None or isinstance(self.content, str):
            content = self.content
        else:
            content = [_part_dict(p) for p in self.content]
        out: dict[str, Json] = {"role": self.role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [dict(c) for c in self.tool_calls]
        return out


def _part_dict(part: ContentPart) -> dict[str, Json]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImageURLPart):
        return {"type": "image_url", "image_url": {"url": part.url, "detail": part.detail}}
    if isinstance(part, InputAudioPart):
        return {"type": "input_audio", "input_audio": {"data": part.data, "format": part.format}}
    return {"type": "video_url", "video_url": {"url": part.url}}


def _parse_part(value: Json, param: str) -> ContentPart:
    if not isinstance(value, dict):
        raise _type_error(param, "an object", value)
    kind = _required_str(value, "type", f"{param}.type")
    if kind == "text":
        return TextPart(_required_str(value, "text", f"{param}.text"))
    if kind in ("image_url", "video_url"):
        inner = value.get(kind)
        if isinstance(inner, str):  # some clients send the URL directly
            url, detail = inner, None
        elif isinstance(inner, dict):
            url = _required_str(inner, "url", f"{param}.{kind}.url")
            detail = _opt_str(inner, "detail", f"{param}.{kind}.detail")
        else:
            raise _type_error(f"{param}.{kind}", "an object", inner)
        return ImageURLPart(url, detail) if kind == "image_url" else VideoURLPart(url)
    if kind == "input_audio":
        inner = value.get("input_audio")
        if not isinstance(inner, dict):
            raise _type_error(f"{param}.input_audio", "an object", inner)
        return InputAudioPart(
            data=_required_str(inner, "data", f"{param}.input_audio.data"),
            format=_required_str(inner, "format", f"{param}.input_audio.format"),
        )
    raise _value_error(
        f"{param}.type",
        f"unsupported content part type '{kind}'; "
        "expected text, image_url, input_audio or video_url.",
    )


def _parse_message(value: Json, param: str) -> ChatMessage:
    if not isinstance(value, dict):
        raise _type_error(param, "an object", value)
    role = _required_str(value, "role", f"{param}.role")
    if role not in ROLES:
        roles = ", ".join(sorted(ROLES))
        raise _value_error(f"{param}.role", f"'{role}'; supported roles are {roles}.")
    raw = value.get("content")
    content: str | tuple[ContentPart, ...] | None
    if raw is None:
        if role != "assistant":
            raise _missing(f"{param}.content")
        content = None
    elif isinstance(raw, str):
        content = raw
    elif isinstance(raw, list):
        if not raw:
            raise _value_error(f"{param}.content", "a content array must not be empty.")
        content = tuple(_parse_part(p, f"{param}.content[{i}]") for i, p in enumerate(raw))
        if role != "user" and not all(isinstance(p, TextPart) for p in content):
            raise _value_error(f"{param}.content", f"a {role} message may only contain text parts.")
    else:
        raise _type_error(f"{param}.content", "a string or an array of content parts", raw)
    tool_calls = value.get("tool_calls")
    if tool_calls is not None and (
        role != "assistant"
        or not isinstance(tool_calls, list)
        or not all(isinstance(c, dict) for c in tool_calls)
    ):
        expected = "an array of objects on an assistant message"
        raise _type_error(f"{param}.tool_calls", expected, tool_calls)
    return ChatMessage(
        role=role,
        content=content,
        name=_opt_str(value, "name", f"{param}.name"),
        tool_call_id=_opt_str(value, "tool_call_id", f"{param}.tool_call_id"),
        tool_calls=tuple(tool_calls or ()),
    )


@dataclass(frozen=True, slots=True)
class AudioOutput:
    voice: str
    format: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatCompletionRequest(GenerationFields):
    model: str
    messages: tuple[ChatMessage, ...]
    logprobs: bool = False
    top_logprobs: int | None = None
    modalities: tuple[str, ...] = ("text",)
    audio: AudioOutput | None = None

    # Names the prompt in context-length errors.
    prompt_param: ClassVar[str] = "messages"

    @property
    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None, or how many alternatives besides the sampled token."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def template_messages(self) -> list[dict[str, Json]]:
        return [m.to_template_dict() for m in self.messages]


def parse_chat_completion_request(body: Body) -> ChatCompletionRequest:
    model = _required_str(body, "model")
    raw = body.get("messages")
    if raw is None:
        raise _missing("messages")
    if not isinstance(raw, list):
        raise _type_error("messages", "an array", raw)
    if not raw:
        raise _value_error("messages", "must contain at least one message.")
    messages = tuple(_parse_message(m, f"messages[{i}]") for i, m in enumerate(raw))

    logprobs = bool(_opt_bool(body, "logprobs"))
    top_logprobs = _opt_int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if top_logprobs is not None and not logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
    _check_response_format(body)
    modalities, audio = _parse_output_modalities(body)
    return ChatCompletionRequest(
        model=model,
        messages=messages,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        modalities=modalities,
        audio=audio,
        **_parse_generation_fields(body),
    )


def _check_response_format(body: Body) -> None:
    fmt = _opt_object(body, "response_format")
    if fmt is not None and fmt.get("type", "text") != "text":
        raise _unsupported("response_format", "only {\"type\": \"text\"} is supported.")


def _parse_output_modalities(body: Body) -> tuple[tuple[str, ...], AudioOutput | None]:
    raw = body.get("modalities")
    if raw is None:
        modalities: tuple[str, ...] = ("text",)
    elif not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
        raise _type_error("modalities", "an array of strings", raw)
    elif not raw or not set(raw) <= MODALITIES:
        supported = ", ".join(sorted(MODALITIES))
        raise _value_error("modalities", f"{raw}; each must be one of {supported}.")
    else:
        modalities = tuple(dict.fromkeys(raw))  # de-duplicated, order kept
    audio_body = _opt_object(body, "audio")
    audio = None
    if audio_body is not None:
        audio = AudioOutput(
            voice=_required_str(audio_body, "voice", "audio.voice"),
            format=_required_str(audio_body, "format", "audio.format"),
        )
        if audio.format not in AUDIO_FORMATS:
            supported = ", ".join(sorted(AUDIO_FORMATS))
            raise _value_error("audio.format", f"'{audio.format}'; supported: {supported}.")
    if "audio" in modalities and audio is None:
        raise bad_request(
            "The 'audio' modality requires the 'audio' parameter (voice and format).",
            param="audio",
        )
    return modalities, audio


# ----------------------------------------------------------------------------- completions

Prompt: TypeAlias = str | tuple[int, ...]


def _parse_prompts(body: Body) -> tuple[Prompt, ...]:
    if body.get("prompt") is None:
        raise _missing("prompt")
    raw = body["prompt"]
    expected = "a string, an array of strings, an array of token ids or an array of token id arrays"
    if isinstance(raw, str):
        return (raw,)
    if not isinstance(raw, list):
        raise _type_error("prompt", expected, raw)
    if not raw:
        raise _value_error("prompt", "must not be empty.")
    if all(isinstance(p, str) for p in raw):
        return tuple(raw)
    if all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return (_token_ids(raw, "prompt"),)
    if all(isinstance(p, list) for p in raw):
        return tuple(_token_ids(p, f"prompt[{i}]") for i, p in enumerate(raw))
    raise _type_error("prompt", expected, raw)


def _token_ids(raw: list[Json], param: str) -> tuple[int, ...]:
    if not raw:
        raise _value_error(param, "a token id array must not be empty.")
    for t in raw:
        if isinstance(t, bool) or not isinstance(t, int):
            raise _type_error(param, "an array of integer token ids", raw)
        if t < 0:
            raise _value_error(param, f"token ids must be non-negative, got {t}.")
    return tuple(raw)


def check_token_ids(token_ids: tuple[int, ...], vocab_size: int, param: str = "prompt") -> None:
    """Token ids sent by the client must exist in the model's vocabulary."""
    bad = next((t for t in token_ids if t >= vocab_size), None)
    if bad is not None:
        raise _value_error(
            param, f"token id {bad} is out of range for a vocabulary of {vocab_size}."
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRequest(GenerationFields):
    model: str
    # One set of n choices per prompt, in order: choice index = prompt index * n + i.
    prompts: tuple[Prompt, ...]
    logprobs: int | None = None

    prompt_param: ClassVar[str] = "prompt"

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs


def parse_completion_request(body: Body) -> CompletionRequest:
    model = _required_str(body, "model")
    prompts = _parse_prompts(body)
    if _opt_bool(body, "echo"):
        raise _unsupported("echo", "the prompt cannot be echoed.")
    if _opt_str(body, "suffix"):
        raise _unsupported("suffix", "insertion is not supported.")
    return CompletionRequest(
        model=model,
        prompts=prompts,
        logprobs=_opt_int(body, "logprobs", lo=0, hi=MAX_COMPLETION_LOGPROBS),
        **_parse_generation_fields(body),
    )


# ----------------------------------------------------------------------------- fitting


def sampling_params(
    request: ChatCompletionRequest | CompletionRequest,
    *,
    num_prompt_tokens: int,
    max_model_len: int,
    stop_token_ids: tuple[int, ...] = (),
) -> SamplingParams:
    """Fit the request to one prompt of num_prompt_tokens tokens.

    positions: 0 ........ num_prompt_tokens ........ max_model_len
               [ prompt  ][ at most max_model_len - num_prompt_tokens new tokens ]
    """
    prompt_param = request.prompt_param
    if num_prompt_tokens <= 0:
        raise _value_error(prompt_param, "the prompt is empty (it encodes to no tokens).")
    room = max_model_len - num_prompt_tokens
    if room <= 0:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"{prompt_param} resulted in {num_prompt_tokens} tokens, which leaves no room for "
            f"the completion. Please reduce the length of the {prompt_param}.",
            param=prompt_param,
            code="context_length_exceeded",
        )
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
    )
