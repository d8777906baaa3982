"""Every request field of OpenAI's and vLLM's chat completions and completions APIs, and
what this server does with each, so that no field a client sends is silently ignored.

A field is HONOURED (implemented; its endpoint's parser validates the value), accepted only
at the value that changes nothing (ACCEPTED_DEFAULT_ONLY), INFORMATIONAL (accepted, and by
its definition it changes no output), or REJECTED. A field in neither API is a 400 naming it.
JSON null always means "the default" and is accepted for every known field.

Sources: OpenAI's chat.completions.create and completions.create (openai-python's
completion_create_params), vLLM's ChatCompletionRequest and CompletionRequest (old fields
such as guided_* and structural_tag included, as clients still send them).

The OpenAI client's extra_body is no field: the client merges it into the body, and the
server merges a literal "extra_body" object into the body before check_fields sees it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, TypeAlias

import orjson

from omni.errors import APIError, bad_request
from omni.serving.requests.fields import Body, Json, type_error, unsupported

Endpoint: TypeAlias = Literal["chat", "completions"]

PATHS: Mapping[Endpoint, str] = MappingProxyType({"chat": "/v1/chat/completions", "completions": "/v1/completions"})


class Disposition(enum.Enum):
    HONOURED = "honoured"
    ACCEPTED_DEFAULT_ONLY = "accepted_default_only"
    INFORMATIONAL = "informational"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class SameAs:
    """A default that is another field's value: best_of is a no-op when it equals n."""

    field: str
    default: Json  # the other field's own default, when the body leaves it out


@dataclass(frozen=True, slots=True)
class JsonType:
    """The shape an INFORMATIONAL value must have: no parser reads it, so this is its check."""

    description: str  # as type_error words it: "a string"
    test: Callable[[Json], bool]


STRING = JsonType("a string", lambda v: isinstance(v, str))
OBJECT = JsonType("an object", lambda v: isinstance(v, dict))
STRING_MAP = JsonType(
    "an object of strings", lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
)


@dataclass(frozen=True, slots=True)
class KnownField:
    disposition: Disposition
    reason: str  # one line; for a refused value, the 400's message says it
    # ACCEPTED_DEFAULT_ONLY: the values (besides null) that change nothing.
    defaults: tuple[Json, ...] = ()
    # INFORMATIONAL: the type the value must have.
    json_type: JsonType | None = None

    def check(self, param: str, value: Json, body: Body) -> None:
        """Raise the 400 for a value this field does not take; value is not null."""
        if self.disposition is Disposition.REJECTED:
            raise unsupported(param, f"{self.reason}.")
        if self.disposition is Disposition.ACCEPTED_DEFAULT_ONLY:
            if not any(_same_json(value, _resolve(d, body)) for d in self.defaults):
                raise unsupported(param, f"{self.reason}; only {self.accepted} is accepted, got {_dump(value)}.")
        elif self.disposition is Disposition.INFORMATIONAL:
            assert self.json_type is not None
            if not self.json_type.test(value):
                raise type_error(param, self.json_type.description, value)
        # HONOURED: the endpoint's parser checks the value.

    @property
    def accepted(self) -> str:
        """The accepted values as the 400 names them, e.g. "false or null", "a value equal to 'n' or null"."""
        words = [f"a value equal to '{d.field}'" if isinstance(d, SameAs) else _dump(d) for d in self.defaults]
        return " or ".join([*words, "null"])


def honoured(reason: str) -> KnownField:
    return KnownField(Disposition.HONOURED, reason)


def default_only(reason: str, *defaults: Json) -> KnownField:
    return KnownField(Disposition.ACCEPTED_DEFAULT_ONLY, reason, defaults=defaults)


def informational(reason: str, json_type: JsonType) -> KnownField:
    return KnownField(Disposition.INFORMATIONAL, reason, json_type=json_type)


def rejected(reason: str) -> KnownField:
    return KnownField(Disposition.REJECTED, reason)


def _resolve(default: Json, body: Body) -> Json:
    if isinstance(default, SameAs):
        value = body.get(default.field)
        return default.default if value is None else value
    return default


def _same_json(a: Json, b: Json) -> bool:
    """Equal as JSON values: true is not 1, but 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _dump(value: Json) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


# ----------------------------------------------------------------------------- the tables

# Both endpoints, OpenAI's fields.
_OPENAI_SHARED: dict[str, KnownField] = {
    "model": honoured("the served model that answers"),
    "frequency_penalty": honoured("a logit penalty for each earlier occurrence of a token"),
    "logit_bias": honoured("added to the logits of the given token ids"),
    "max_tokens": honoured("the most tokens to generate"),
    "n": honoured("how many independent choices to generate"),
    "presence_penalty": honoured("a logit penalty for tokens that have occurred"),
    "seed": honoured("seeds each choice's sampling"),
    "stop": honoured("strings that end generation, left out of the text"),
    "stream": honoured("server-sent events, one chunk per decoded delta"),
    "stream_options": honoured("include_usage and continuous_usage_stats (STREAM_OPTIONS_FIELDS)"),
    "temperature": honoured("the sampling temperature; 0 is greedy"),
    "top_p": honoured("nucleus sampling"),
    "user": informational("an end-user id for abuse monitoring; it changes no output", STRING),
}

# Both endpoints, vLLM's sampling parameters and extra fields.
_VLLM_SHARED: dict[str, KnownField] = {
    "best_of": default_only("only the n choices asked for are generated (no best-of selection)", SameAs("n", 1)),
    "use_beam_search": default_only("beam search is not implemented", False),
    "length_penalty": default_only("it scores beams, and beam search is not implemented", 1.0),
    "early_stopping": default_only("it ends beam search, and beam search is not implemented", False),
    "watermarking": default_only("output watermarking is not implemented", False),
    "top_k": honoured("samples from the k most likely tokens; -1 and 0 mean all"),
    "min_p": honoured("drops tokens less likely than min_p times the most likely one"),
    "repetition_penalty": honoured("divides (or multiplies) the logits of tokens seen in prompt or output"),
    "stop_token_ids": honoured("token ids that end generation"),
    "include_stop_str_in_output": honoured("keeps the matched stop string in the text"),
    "ignore_eos": honoured("generation goes on past the end-of-sequence token"),
    "min_tokens": honoured("no end of generation before this many tokens"),
    "skip_special_tokens": honoured("special tokens left out of the text"),
    "spaces_between_special_tokens": default_only(
        "special tokens in the text are decoded as the fast tokenizer writes them (vLLM's default)", True
    ),
    "truncate_prompt_tokens": honoured("keeps only the prompt's last N tokens"),
    "truncation_side": default_only(
        "truncate_prompt_tokens keeps the prompt's last tokens; keeping the first ones is not available", "left"
    ),
    "prompt_logprobs": honoured("log probabilities of the prompt's tokens"),
    "logprob_token_ids": rejected("log probabilities of chosen token ids are not implemented; use top logprobs"),
    "allowed_token_ids": honoured("restricts sampling to these token ids"),
    "bad_words": honoured("words whose token sequences are never completed"),
    "response_format": honoured("constrains the output to JSON or a JSON schema"),
    "structured_outputs": honoured("constrains the output: json, regex, choice, grammar or json_object"),
    "guided_json": honoured("vLLM's older name for structured_outputs.json"),
    "guided_regex": honoured("vLLM's older name for structured_outputs.regex"),
    "guided_choice": honoured("vLLM's older name for structured_outputs.choice"),
    "guided_grammar": honoured("vLLM's older name for structured_outputs.grammar"),
    "guided_decoding_backend": informational(
        "it names an implementation; every constraint is compiled by llguidance with the same output rules", STRING
    ),
    "guided_whitespace_pattern": rejected("JSON output uses compact separators; its whitespace is not configurable"),
    "structural_tag": rejected("structural tags are not implemented"),
    "priority": default_only("requests are scheduled first come, first served", 0),
    "request_id": honoured("the client's id for the request, used instead of a generated one"),
    "session_id": informational("a stable id shared by related requests, for routing; it changes no output", STRING),
    "logits_processors": rejected("custom logits processors cannot be loaded"),
    "return_tokens_as_token_ids": honoured("logprobs name tokens as 'token_id:N'"),
    "return_token_ids": default_only("token ids are not returned alongside the text", False),
    "return_token_offsets": default_only("it is for the render endpoints, which this server does not have", False),
    "return_mm_kwargs": default_only("it is for the render endpoints, which this server does not have", True),
    "routed_experts_prompt_start": default_only("routed-expert data is not returned", 0),
    "cache_salt": rejected("the prefix cache is shared by all requests; per-request salting is not implemented"),
    "kv_transfer_params": rejected("there is no disaggregated (KV transfer) serving"),
    "ec_transfer_params": rejected("there is no encoder-cache transfer"),
    "vllm_xargs": rejected("there are no custom extensions to read them"),
    "repetition_detection": rejected("repetition detection is not implemented"),
    "stream_interval": default_only("a chunk is sent as soon as its text is decoded; batching tokens is not available", 1),
    "thinking_token_budget": honoured("caps the tokens spent reasoning"),
}

CHAT_FIELDS: Mapping[str, KnownField] = MappingProxyType(
    {
        **_OPENAI_SHARED,
        # OpenAI's chat fields
        "messages": honoured("the conversation, rendered by the chat template"),
        "audio": honoured("the voice and format of audio output (with modalities naming audio)"),
        "function_call": rejected("it is deprecated; use tool_choice"),
        "functions": rejected("it is deprecated; use tools"),
        "logprobs": honoured("log probabilities of the sampled tokens"),
        "top_logprobs": honoured("the most likely alternatives at each position, with logprobs"),
        "max_completion_tokens": honoured("the most tokens to generate (wins over max_tokens)"),
        "metadata": informational("tags for stored completions; nothing is stored and it changes no output", STRING_MAP),
        "modalities": honoured(
            "the output modalities: text, image on a model with a vision decoder, audio on one with an audio decoder"
        ),
        "image": honoured("how the images the model draws are drawn and returned (an extension, shaped like audio)"),
        "moderation": rejected("no moderation model runs on the input or the output"),
        "parallel_tool_calls": honoured("whether one turn may call several tools"),
        "prediction": rejected("predicted outputs are not implemented"),
        "prompt_cache_key": informational(
            "a cache-routing hint; the prefix cache matches prompts by content, and it changes no output", STRING
        ),
        "prompt_cache_options": rejected(
            "the prefix cache is automatic: explicit breakpoints and minimum lifetimes cannot be set"
        ),
        "prompt_cache_retention": default_only(
            "cached prefixes stay in memory until evicted; extended (24h) retention is not available", "in_memory"
        ),
        "reasoning_effort": rejected("reasoning effort is not controllable; thinking_token_budget caps reasoning"),
        "safety_identifier": informational("an end-user id for abuse monitoring; it changes no output", STRING),
        "service_tier": default_only("there is one processing tier", "auto", "default"),
        "store": default_only("completions are not stored", False),
        "tool_choice": honoured("none, auto, required or a named function"),
        "tools": honoured("the functions the model may call"),
        "verbosity": rejected("the verbosity of a response is not controllable"),
        "web_search_options": rejected("there is no web search tool"),
        **_VLLM_SHARED,
        # vLLM's chat fields
        "echo": honoured("the reply starts with the last message when that is the assistant's"),
        "add_generation_prompt": honoured("the template's opening of the assistant's turn"),
        "continue_final_message": honoured("the reply continues the final (assistant) message"),
        "add_special_tokens": default_only(
            "the chat template writes the special tokens itself (vLLM's chat default)", False
        ),
        "documents": honoured("passed to the chat template, for templates that render retrieved documents"),
        "chat_template": honoured("a Jinja template used instead of the model's"),
        "chat_template_kwargs": honoured("extra variables for the chat template"),
        "media_io_kwargs": rejected("media loading options are server settings"),
        "mm_processor_kwargs": rejected("media preprocessing options are server settings"),
        "return_prompt_text": default_only("the rendered prompt is not returned", False),
        "include_reasoning": default_only("reasoning text is always included in the reply", True),
    }
)

COMPLETION_FIELDS: Mapping[str, KnownField] = MappingProxyType(
    {
        **_OPENAI_SHARED,
        # OpenAI's completions fields
        "prompt": honoured("text or token ids, one or many prompts"),
        "echo": honoured("the completion starts with the prompt"),
        "logprobs": honoured("log probabilities of the sampled token and up to 5 alternatives"),
        "suffix": default_only("text insertion (fill in the middle) is not supported", ""),
        **_VLLM_SHARED,
        # vLLM's completions fields
        "prompt_embeds": rejected("prompts as embeddings are not supported; send text or token ids"),
        "add_special_tokens": default_only(
            "a text prompt is encoded with the tokenizer's special tokens, e.g. BOS (vLLM's completions default)", True
        ),
    }
)

# The keys of stream_options (both endpoints).
STREAM_OPTIONS_FIELDS: Mapping[str, KnownField] = MappingProxyType(
    {
        "include_usage": honoured("a last chunk with the usage of the whole request"),
        "continuous_usage_stats": honoured("usage so far on every chunk (vLLM)"),
        "include_obfuscation": default_only("streamed chunks carry no obfuscation padding", False),
    }
)

FIELDS: Mapping[Endpoint, Mapping[str, KnownField]] = MappingProxyType(
    {"chat": CHAT_FIELDS, "completions": COMPLETION_FIELDS}
)


# ----------------------------------------------------------------------------- the check


def check_fields(body: Body, endpoint: Endpoint) -> None:
    """Raise a 400 naming the first field the endpoint does not take: one in neither API
    ("unknown_parameter"), or a value it cannot honour ("unsupported_parameter")."""
    table = FIELDS[endpoint]
    for name, value in body.items():
        field = table.get(name)
        if field is None:
            raise _unknown(name, endpoint)
        if value is not None:
            field.check(name, value, body)
    options = body.get("stream_options")
    if isinstance(options, dict):  # anything else is the parser's type error
        for key, value in options.items():
            param = f"stream_options.{key}"
            field = STREAM_OPTIONS_FIELDS.get(key)
            if field is None:
                raise _unknown(param, endpoint)
            if value is not None:
                field.check(param, value, body)


def _unknown(param: str, endpoint: Endpoint) -> APIError:
    if param.startswith("stream_options."):
        where = "a key of stream_options"
    else:
        where = f"a field of {PATHS[endpoint]}"
        other: Endpoint = "completions" if endpoint == "chat" else "chat"
        if param in FIELDS[other]:  # e.g. prompt sent to chat: say where it belongs
            where += f" (it is one of {PATHS[other]})"
    return bad_request(
        f"Unrecognized request argument supplied: '{param}' is not {where} in OpenAI's or vLLM's API.",
        param=param,
        code="unknown_parameter",
    )
