"""What the generation endpoints share: each field declared once, as a msgspec Struct field
with its type, bounds, description and disposition (what this server does with it), and the
request base both chat and completions build on (omni/serving/sampling.py fits it to a prompt).

A field's disposition rides in its Meta: HONOURED (implemented), ACCEPTED_DEFAULT_ONLY (taken
only at the value that changes nothing), INFORMATIONAL (taken; by its definition it changes no
output) or REJECTED. dispositions.py reads the tables back from the Structs, so a field of
OpenAI's or vLLM's API cannot be added without saying what happens to it.

JSON null means "the default" for every top-level field: the parser drops top-level nulls
before msgspec sees the body, so a field's Python default is its one default.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal, TypeAlias

import msgspec
import orjson
from msgspec import Meta, Struct, field

from omni.errors import bad_request
from omni.serving.requests.fields import (
    MAX_N,
    MAX_PRIORITY,
    MAX_REQUEST_ID_LENGTH,
    MAX_SEED,
    MAX_STOP_STRINGS,
    MIN_PRIORITY,
    MIN_SEED,
    Json,
    type_error,
    unsupported,
    value_error,
)
from omni.shared.sampling_bounds import sampling_bound

# ----------------------------------------------------------------------------- dispositions


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
    """The shape an INFORMATIONAL value must have, as check_fields tests it."""

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

    def check(self, param: str, value: Json, body: Mapping[str, Json]) -> None:
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
        # HONOURED: the Struct's type and the request's checks judge the value.

    @property
    def accepted(self) -> str:
        """The accepted values as the 400 names them, e.g. "false or null", "a value equal to 'n' or null"."""
        words = [f"a value equal to '{d.field}'" if isinstance(d, SameAs) else _dump(d) for d in self.defaults]
        return " or ".join([*words, "null"])


def _resolve(default: Json, body: Mapping[str, Json]) -> Json:
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


KNOWN = "known"  # the Meta.extra key of a field's KnownField


def honoured(reason: str, **constraints: Any) -> Meta:
    return Meta(description=reason, extra={KNOWN: KnownField(Disposition.HONOURED, reason)}, **constraints)


# A request's place in the scheduling order, declared once for every endpoint that takes it:
# chat, completions, responses, images and their edits, speech, transcriptions.
Priority: TypeAlias = Annotated[
    int,
    honoured(
        "the scheduling order, lower first, ties in arrival order (--scheduling-policy priority); "
        "under the default fcfs policy only 0 is accepted",
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
    ),
]


def informational(reason: str, json_type: JsonType) -> Meta:
    return Meta(description=reason, extra={KNOWN: KnownField(Disposition.INFORMATIONAL, reason, json_type=json_type)})


def default_only(reason: str, *defaults: Json) -> Meta:
    known = KnownField(Disposition.ACCEPTED_DEFAULT_ONLY, reason, defaults=defaults)
    return Meta(description=f"Only {known.accepted} is accepted: {reason}.", extra={KNOWN: known})


def rejected(reason: str) -> Meta:
    return Meta(description=f"Not supported: {reason}. Only null is accepted.", extra={KNOWN: KnownField(Disposition.REJECTED, reason)})


def known_fields(cls: type[Struct]) -> Mapping[str, KnownField]:
    """The Struct's fields by their JSON names, each with its disposition."""
    table: dict[str, KnownField] = {}
    for f in msgspec.structs.fields(cls):
        known = field_meta(f.type).get(KNOWN)
        assert isinstance(known, KnownField), f"{cls.__name__}.{f.name} has no disposition"
        table[f.encode_name] = known
    return MappingProxyType(table)


def check_known(
    body: Mapping[str, Json], table: Mapping[str, KnownField], path: str, *, list_fields: bool = False
) -> None:
    """A 400 naming the first field the endpoint does not know (and, with list_fields, the
    ones it knows), or a value it does not take."""
    for name, value in body.items():
        known = table.get(name)
        if known is None:
            listed = f" (fields: {', '.join(sorted(table))})" if list_fields else ""
            raise bad_request(
                f"Unrecognized request argument supplied: '{name}' is not a field of {path}{listed}.",
                param=name,
                code="unknown_parameter",
            )
        if value is not None:
            known.check(name, value, body)


def field_meta(annotation: Any) -> dict[str, Any]:
    """The Meta.extra of an annotation, or of a member of its union (`Annotated[int, ...] | None`)."""
    extra: dict[str, Any] = {}
    if typing.get_origin(annotation) is Annotated:
        for m in annotation.__metadata__:
            if isinstance(m, Meta) and m.extra:
                extra |= m.extra
    elif typing.get_origin(annotation) in (types.UnionType, typing.Union):
        for arg in typing.get_args(annotation):
            extra |= field_meta(arg)
    return extra


# A field the Struct declares only for its disposition: check_fields refuses every value
# but the accepted ones before conversion, so its type is the JSON it may carry.
Refused: TypeAlias = Any


# ----------------------------------------------------------------------------- nested objects


class StreamOptions(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    include_usage: Annotated[bool | None, honoured("a last chunk with the usage of the whole request")] = None
    continuous_usage_stats: Annotated[bool | None, honoured("usage so far on every chunk (vLLM)")] = None
    include_obfuscation: Annotated[Refused, default_only("streamed chunks carry no obfuscation padding", False)] = None


class JsonSchemaFormat(Struct, frozen=True, kw_only=True):
    name: str | None = None
    description: str | None = None
    # OpenAI: omitted means any JSON (an empty schema)
    schema_: dict[str, Any] | bool = field(name="schema", default_factory=dict)
    strict: bool | None = None


class TextFormat(Struct, frozen=True, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(Struct, frozen=True, tag_field="type", tag="json_object"):
    pass


class JsonSchemaResponseFormat(Struct, frozen=True, tag_field="type", tag="json_schema"):
    json_schema: JsonSchemaFormat


ResponseFormat: TypeAlias = TextFormat | JsonObjectFormat | JsonSchemaResponseFormat

NonEmptyString: TypeAlias = Annotated[str, Meta(min_length=1)]
JsonSchemaValue: TypeAlias = Annotated[dict[str, Any] | bool, Meta(description="A JSON schema.")]
Choices: TypeAlias = Annotated[list[NonEmptyString], Meta(min_length=1)]


class StructuredOutputs(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object."""

    json: JsonSchemaValue | str | None = None
    regex: NonEmptyString | None = None
    choice: Choices | None = None
    grammar: NonEmptyString | None = None
    json_object: Literal[True, False] | None = None
    backend: str | None = None
    whitespace_pattern: Annotated[Any, Meta(description="Not supported: JSON output uses compact separators.")] = None


TokenId: TypeAlias = Annotated[int, Meta(ge=0)]
TokenIds: TypeAlias = list[TokenId]

# vLLM's backend names: they pick an implementation, and every request here gets llguidance.
GuidedBackend: TypeAlias = Literal["auto", "guidance", "llguidance", "xgrammar", "outlines", "lm-format-enforcer"]


# ----------------------------------------------------------------------------- the shared fields


class GenerationFields(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The fields both endpoints share, as sent (null dropped), with what they mean as properties."""

    # OpenAI's fields of both endpoints
    model: Annotated[str, honoured("the served model that answers")]
    frequency_penalty: Annotated[
        float, honoured("a logit penalty for each earlier occurrence of a token", **sampling_bound("frequency_penalty"))
    ] = 0.0
    logit_bias_sent: Annotated[
        dict[Annotated[str, Meta(pattern="^[0-9]+$")], Annotated[float, Meta(**sampling_bound("logit_bias_values"))]],
        honoured("added to the logits of the given token ids (token id as a decimal string, each id once)"),
    ] = field(name="logit_bias", default_factory=dict)
    # None: as many as the context allows.
    max_tokens: Annotated[int, honoured("the most tokens to generate", ge=1)] | None = None
    n: Annotated[int, honoured("how many independent choices to generate", ge=1, le=MAX_N)] = 1
    presence_penalty: Annotated[float, honoured("a logit penalty for tokens that have occurred", **sampling_bound("presence_penalty"))] = 0.0
    # le: msgspec's bounds are int64; MAX_SEED is checked in check_generation
    seed: Annotated[
        int, honoured("seeds each choice's sampling", ge=MIN_SEED, extra_json_schema={"maximum": MAX_SEED})
    ] | None = None
    stop_sent: Annotated[
        NonEmptyString | Annotated[list[NonEmptyString], Meta(max_length=MAX_STOP_STRINGS)],
        honoured("strings that end generation, left out of the text"),
    ] = field(name="stop", default_factory=list)
    stream: Annotated[bool, honoured("server-sent events, one chunk per decoded delta")] = False
    stream_options: Annotated[
        StreamOptions, honoured("include_usage and continuous_usage_stats; only with stream")
    ] | None = None
    temperature: Annotated[float, honoured("the sampling temperature; 0 is greedy", **sampling_bound("temperature"))] = 1.0
    top_p: Annotated[float, honoured("nucleus sampling", **sampling_bound("top_p"))] = 1.0
    user: Annotated[str | None, informational("an end-user id for abuse monitoring; it changes no output", STRING)] = None

    # vLLM's sampling parameters and extra fields of both endpoints
    best_of: Annotated[
        Refused, default_only("only the n choices asked for are generated (no best-of selection)", SameAs("n", 1))
    ] = None
    use_beam_search: Annotated[Refused, default_only("beam search is not implemented", False)] = None
    length_penalty: Annotated[Refused, default_only("it scores beams, and beam search is not implemented", 1.0)] = None
    early_stopping: Annotated[
        Refused, default_only("it ends beam search, and beam search is not implemented", False)
    ] = None
    watermarking: Annotated[Refused, default_only("output watermarking is not implemented", False)] = None
    top_k_sent: Annotated[
        int, honoured("samples from the k most likely tokens; -1 and 0 mean all", ge=-1)
    ] | None = field(name="top_k", default=None)
    min_p: Annotated[
        float, honoured("drops tokens less likely than min_p times the most likely one", **sampling_bound("min_p"))
    ] = 0.0
    repetition_penalty: Annotated[
        float,
        honoured(
            "divides (or multiplies) the logits of tokens seen in prompt or output",
            **sampling_bound("repetition_penalty"),
        ),
    ] = 1.0
    stop_token_ids_sent: Annotated[TokenIds, honoured("token ids that end generation")] = field(
        name="stop_token_ids", default_factory=list
    )
    include_stop_str_in_output: Annotated[bool, honoured("keeps the matched stop string in the text")] = False
    ignore_eos: Annotated[bool, honoured("generation goes on past the end-of-sequence token")] = False
    speculative: Annotated[
        bool, honoured("false keeps this request out of speculative decoding (the server's --speculative-config)")
    ] = True
    min_tokens: Annotated[int, honoured("no end of generation before this many tokens", **sampling_bound("min_tokens"))] = 0
    skip_special_tokens: Annotated[bool, honoured("special tokens left out of the text")] = True
    spaces_between_special_tokens: Annotated[
        Refused,
        default_only("special tokens in the text are decoded as the fast tokenizer writes them (vLLM's default)", True),
    ] = None
    # Keep only the last N prompt tokens; -1: the model's max_model_len (truncate_prompt).
    truncate_prompt_tokens: Annotated[
        int,
        honoured(
            "keeps only the prompt's last N tokens; -1: the model's maximum context length",
            ge=-1,
            extra_json_schema={"not": {"const": 0}},  # check_generation refuses 0
        ),
    ] | None = None
    truncation_side: Annotated[
        Refused,
        default_only(
            "truncate_prompt_tokens keeps the prompt's last tokens; keeping the first ones is not available", "left"
        ),
    ] = None
    # vLLM's prompt_logprobs: None, or the alternatives listed per prompt position. Never
    # with stream beyond 0 (refused) and never streamed, as in vLLM.
    prompt_logprobs: Annotated[
        int, honoured("log probabilities of the prompt's tokens", **sampling_bound("prompt_logprobs"))
    ] | None = None
    logprob_token_ids: Annotated[
        Refused, rejected("log probabilities of chosen token ids are not implemented; use top logprobs")
    ] = None
    allowed_token_ids_sent: Annotated[
        Annotated[TokenIds, Meta(min_length=1)], honoured("restricts sampling to these token ids")
    ] | None = field(name="allowed_token_ids", default=None)
    bad_words_sent: Annotated[
        list[Annotated[str, Meta(pattern=r"\S")]], honoured("words whose token sequences are never completed")
    ] = field(name="bad_words", default_factory=list)
    response_format: Annotated[ResponseFormat, honoured("constrains the output to JSON or a JSON schema")] | None = None
    structured_outputs: Annotated[
        StructuredOutputs, honoured("constrains the output: json, regex, choice, grammar or json_object")
    ] | None = None
    guided_json: Annotated[
        JsonSchemaValue | str, honoured("vLLM's older name for structured_outputs.json (a JSON schema, or its JSON text)")
    ] | None = None
    guided_regex: Annotated[NonEmptyString, honoured("vLLM's older name for structured_outputs.regex")] | None = None
    guided_choice: Annotated[Choices, honoured("vLLM's older name for structured_outputs.choice")] | None = None
    guided_grammar: Annotated[NonEmptyString, honoured("vLLM's older name for structured_outputs.grammar")] | None = None
    guided_decoding_backend: Annotated[
        GuidedBackend | None,
        informational(
            "it names an implementation; every constraint is compiled by llguidance with the same output rules", STRING
        ),
    ] = None
    guided_whitespace_pattern: Annotated[
        Refused, rejected("JSON output uses compact separators; its whitespace is not configurable")
    ] = None
    structural_tag: Annotated[Refused, rejected("structural tags are not implemented")] = None
    priority: Priority = 0
    # the client's id for the request: the response id's tail
    request_id: Annotated[
        str,
        honoured(
            "the client's id for the request, used instead of a generated one",
            min_length=1,
            max_length=MAX_REQUEST_ID_LENGTH,
            pattern=r"^[^\x00-\x1f\x7f-\x9f]+$",
        ),
    ] | None = None
    session_id: Annotated[
        str | None,
        informational("a stable id shared by related requests, for routing; it changes no output", STRING),
    ] = None
    logits_processors: Annotated[Refused, rejected("custom logits processors cannot be loaded")] = None
    return_tokens_as_token_ids: Annotated[bool, honoured("logprobs name tokens as 'token_id:N'")] = False
    return_token_ids: Annotated[Refused, default_only("token ids are not returned alongside the text", False)] = None
    return_token_offsets: Annotated[
        Refused, default_only("it is for the render endpoints, which this server does not have", False)
    ] = None
    return_mm_kwargs: Annotated[
        Refused, default_only("it is for the render endpoints, which this server does not have", True)
    ] = None
    routed_experts_prompt_start: Annotated[Refused, default_only("routed-expert data is not returned", 0)] = None
    # requests share cached prompt blocks only with requests of the same salt
    cache_salt: Annotated[
        str, honoured("shares the prefix cache only with requests of the same salt (vLLM's)", min_length=1)
    ] | None = None
    kv_transfer_params: Annotated[Refused, rejected("there is no disaggregated (KV transfer) serving")] = None
    ec_transfer_params: Annotated[Refused, rejected("there is no encoder-cache transfer")] = None
    vllm_xargs: Annotated[Refused, rejected("there are no custom extensions to read them")] = None
    repetition_detection: Annotated[Refused, rejected("repetition detection is not implemented")] = None
    stream_interval: Annotated[
        Refused,
        default_only("a chunk is sent as soon as its text is decoded; batching tokens is not available", 1),
    ] = None
    # reasoning tokens at most, then </think> is forced
    thinking_token_budget: Annotated[int, honoured("caps the tokens spent reasoning", ge=0)] | None = None

    # Names the prompt in context-length errors; each endpoint's request sets it.
    prompt_param: ClassVar[str]
    logprobs_param: ClassVar[str]

    # ------------------------------------------------------------------ what the fields mean

    @property
    def max_tokens_param(self) -> str:
        """The field max_tokens came from, to name it in a context-length error."""
        return "max_tokens"

    @property
    def top_k(self) -> int | None:
        return self.top_k_sent if self.top_k_sent is not None and self.top_k_sent > 0 else None  # -1 and 0: off

    @property
    def stop(self) -> tuple[str, ...]:
        return (self.stop_sent,) if isinstance(self.stop_sent, str) else tuple(self.stop_sent)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return tuple(self.stop_token_ids_sent)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage is True

    @property
    def continuous_usage(self) -> bool:
        """Every streamed chunk carries the usage so far (only with include_usage, as in vLLM)."""
        return self.include_usage and self.stream_options is not None and self.stream_options.continuous_usage_stats is True

    @property
    def logit_bias(self) -> tuple[tuple[int, float], ...]:
        """(token id, bias), sorted by id; ids are checked against the vocabulary in sampling_params."""
        return tuple(sorted((int(k), v) for k, v in self.logit_bias_sent.items()))

    @property
    def allowed_token_ids(self) -> tuple[int, ...] | None:
        """None: no restriction."""
        return None if self.allowed_token_ids_sent is None else tuple(sorted(set(self.allowed_token_ids_sent)))

    @property
    def bad_words(self) -> tuple[str, ...]:
        return tuple(self.bad_words_sent)  # tokenized in sampling_params

    @property
    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None, or how many alternatives besides the sampled token."""
        raise NotImplementedError  # each endpoint spells logprobs its own way

    @property
    def num_prompt_logprobs(self) -> int | None:
        """SamplingParams.prompt_logprobs: what the response will show of the prompt (nothing
        of it in a stream)."""
        return None if self.stream else self.prompt_logprobs


def check_generation(req: GenerationFields) -> None:
    """The rules between the shared fields, and what a type cannot say."""
    if req.min_tokens and req.max_tokens is not None and req.min_tokens > req.max_tokens:
        raise value_error(
            "min_tokens", f"must be at most {req.max_tokens_param} ({req.max_tokens}), got {req.min_tokens}."
        )
    if req.seed is not None and req.seed > MAX_SEED:
        raise value_error("seed", f"must be between {MIN_SEED} and {MAX_SEED}, got {req.seed}.")
    if req.stream_options is not None and not req.stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true.", param="stream_options")
    if req.prompt_logprobs and req.stream:
        raise bad_request("'prompt_logprobs' are not available when 'stream' is true.", param="prompt_logprobs")
    if req.truncate_prompt_tokens is not None and req.truncate_prompt_tokens in (0,):
        raise value_error(
            "truncate_prompt_tokens",
            f"must be at least 1, or -1 for the model's maximum context length, got {req.truncate_prompt_tokens}.",
        )
    if req.request_id is not None and not req.request_id.isprintable():
        raise value_error(
            "request_id",
            f"must be 1 to {MAX_REQUEST_ID_LENGTH} printable characters, got {len(req.request_id)} characters.",
        )
    seen: set[int] = set()
    for key in req.logit_bias_sent:
        # isascii: str.isdigit() also accepts digits like "²", which int() refuses
        token_id = int(key)
        if token_id in seen:  # "5" and "05"
            raise value_error("logit_bias", f"token id {token_id} appears more than once.")
        seen.add(token_id)
