"""The body of POST /v1/chat/completions: messages and their content parts, output modalities,
tools, the chat template's fields. Each field is declared once (common.py says how); the
rules between fields are in check_chat_request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeAlias

import orjson
from msgspec import Meta, Struct, field
from msgspec.structs import force_setattr

from omni.errors import bad_request
from omni.serving.requests.common import (
    STRING,
    STRING_MAP,
    GenerationFields,
    Refused,
    default_only,
    honoured,
    informational,
    rejected,
)
from omni.serving.requests.fields import Json, missing, type_error, value_error
from omni.serving.requests.images import ChatImageOptions, check_image_options
from omni.serving.requests.reasoning import ReasoningEffort, effort_template_kwargs
from omni.serving.requests.structured import grammar_of
from omni.serving.requests.tools import MAX_TOOLS, NamedToolChoice, Tool, ToolFields, tool_fields
from omni.text.constrained.spec import GrammarSpec

MAX_TOP_LOGPROBS = 20
# Messages and content parts in one request, in all. Azure OpenAI takes at most 2048 messages;
# this is far past any conversation a context holds, and keeps a 60 MB body of half a million
# tiny messages from costing seconds of parsing, rendering and freeing.
MAX_CHAT_ITEMS = 16_384

Role: TypeAlias = Literal["system", "developer", "user", "assistant", "tool"]
Modality: TypeAlias = Literal["text", "image", "audio"]
AudioFormat: TypeAlias = Literal["wav", "mp3", "flac", "opus", "pcm16", "aac"]
AUDIO_FORMATS = frozenset(AudioFormat.__args__)  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- content parts


class TextPart(Struct, frozen=True, tag_field="type", tag="text"):
    text: str

    @property
    def type(self) -> str:
        return "text"


class ImageURL(Struct, frozen=True, kw_only=True):
    url: str  # http(s) URL or data: URL; fetching and size limits are the media layer's job
    detail: str | None = None


class ImageURLPart(Struct, frozen=True, tag_field="type", tag="image_url"):
    image_url: str | ImageURL  # some clients send the URL directly

    @property
    def type(self) -> str:
        return "image_url"

    @property
    def url(self) -> str:
        return self.image_url if isinstance(self.image_url, str) else self.image_url.url

    @property
    def detail(self) -> str | None:
        return None if isinstance(self.image_url, str) else self.image_url.detail


class InputAudio(Struct, frozen=True, kw_only=True):
    data: str  # base64
    format: str


class InputAudioPart(Struct, frozen=True, tag_field="type", tag="input_audio"):
    input_audio: InputAudio

    @property
    def type(self) -> str:
        return "input_audio"

    @property
    def data(self) -> str:
        return self.input_audio.data

    @property
    def format(self) -> str:
        return self.input_audio.format


class VideoURL(Struct, frozen=True, kw_only=True):
    url: str


class VideoURLPart(Struct, frozen=True, tag_field="type", tag="video_url"):
    video_url: str | VideoURL

    @property
    def type(self) -> str:
        return "video_url"

    @property
    def url(self) -> str:
        return self.video_url if isinstance(self.video_url, str) else self.video_url.url


ContentPart: TypeAlias = TextPart | ImageURLPart | InputAudioPart | VideoURLPart


# ----------------------------------------------------------------------------- messages


class FunctionCall(Struct, frozen=True, kw_only=True):
    name: str
    arguments: str | dict[str, Any] = "{}"  # JSON text, as OpenAI sends it; an object is taken too


class ToolCall(Struct, frozen=True, kw_only=True):
    function: FunctionCall
    id: str | None = None
    type: Literal["function"] = "function"


class AudioRef(Struct, frozen=True, kw_only=True):
    id: Annotated[str, Meta(pattern="^audio_[A-Za-z0-9]+$", description="The id of an earlier spoken answer.")]


# How a message's text parts join into its text: as vLLM joins them for a template that takes a
# string ("\n"), so text parts render as that text sent as a string does, under every template.
TEXT_PART_SEPARATOR = "\n"


# Keys a client echoes back on a message (refusal, annotations...) are left alone, as OpenAI does.
class ChatMessage(Struct, frozen=True, kw_only=True):
    role: Role
    # None only for an assistant turn (e.g. one that only made tool calls).
    content: str | Annotated[tuple[ContentPart, ...], Meta(min_length=1)] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None  # an assistant's earlier calls
    reasoning_content: str | None = None  # an earlier turn's reasoning, for templates that show it
    reasoning: str | None = None  # another name for reasoning_content
    # An earlier spoken answer referred to by its id (OpenAI's assistant {"audio": {"id"}}): its
    # stored transcript becomes the turn's text (omni/serving/prompt.py recall_spoken).
    audio: AudioRef | None = None

    def __post_init__(self) -> None:
        if self.reasoning_content is None and self.reasoning is not None:
            force_setattr(self, "reasoning_content", self.reasoning)

    @property
    def audio_id(self) -> str | None:
        return None if self.audio is None else self.audio.id

    @property
    def text(self) -> str:
        """The message's text parts joined (TEXT_PART_SEPARATOR); media parts contribute nothing."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return TEXT_PART_SEPARATOR.join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def has_media(self) -> bool:
        return isinstance(self.content, tuple) and not all(isinstance(p, TextPart) for p in self.content)

    def to_template_dict(self) -> dict[str, Json]:
        """The message as a chat template expects it: text parts alone as their joined text (a
        template then renders them as it renders that string), media parts as typed dicts; each
        earlier call's arguments an object (Hugging Face templates iterate them), and a call whose
        arguments are no object left out (_arguments says why)."""
        content: Json
        if self.content is None or isinstance(self.content, str) or not self.has_media:
            content = None if self.content is None else self.text
        else:
            content = [_part_dict(p) for p in self.content]
        out: dict[str, Json] = {"role": self.role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        calls = [d for d in map(_call_dict, self.tool_calls or ()) if d is not None]
        if calls:
            out["tool_calls"] = calls
        elif self.tool_calls and content is None:  # every call left out: an empty turn, not "None"
            out["content"] = ""
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        return out


def _part_dict(part: ContentPart) -> dict[str, Json]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImageURLPart):
        return {"type": "image_url", "image_url": {"url": part.url, "detail": part.detail}}
    if isinstance(part, InputAudioPart):
        return {"type": "input_audio", "input_audio": {"data": part.data, "format": part.format}}
    return {"type": "video_url", "video_url": {"url": part.url}}


# A call whose arguments are no JSON object is left out of the prompt, and not refused. The
# server writes such calls itself: the length limit cuts a call mid-arguments ('{"city": "Par'),
# and chat's reply, a Realtime conversation and a stored response keep it as the model wrote it
# (finish_reason length; status incomplete). Sent back, the turn must render: OpenAI takes any
# arguments text, and vLLM's json.loads of it is a 400 for a conversation the server produced.
# Left out rather than rendered as its raw text because templates iterate the arguments
# (hyperclovax_omni.jinja: `fn.arguments.items()`), and a cut call was never run: what the next
# turn needs is the calls that were, and their results.
def _arguments(call: ToolCall) -> dict[str, Any] | None:
    args = call.function.arguments
    if not isinstance(args, str):
        return args
    try:
        value = orjson.loads(args or "{}")
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _call_dict(call: ToolCall) -> dict[str, Json] | None:
    args = _arguments(call)
    if args is None:
        return None
    out: dict[str, Json] = {"type": "function", "function": {"name": call.function.name, "arguments": args}}
    if call.id is not None:
        out["id"] = call.id
    return out


# ----------------------------------------------------------------------------- output options


class AudioOutput(Struct, frozen=True, forbid_unknown_fields=True):
    voice: str
    format: AudioFormat


# Variables the server itself passes to every template; chat_template_kwargs may not set them.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template", "tokenize"}
)
MAX_TEMPLATE_BYTES = 64 * 1024


class TemplateFields(Struct, frozen=True, kw_only=True):
    """How the messages are rendered: vLLM's chat template fields."""

    chat_template: str | None = None  # a per-request template (the server may refuse it)
    kwargs: Mapping[str, Json] = field(default_factory=dict)  # extra template variables
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # the reply continues the last (assistant) message
    documents: tuple[Mapping[str, Json], ...] = ()  # for templates that render retrieved documents


# ----------------------------------------------------------------------------- the request


class ChatCompletionRequest(GenerationFields, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # OpenAI's chat fields
    messages: Annotated[
        tuple[ChatMessage, ...], honoured("the conversation, rendered by the chat template", min_length=1)
    ]
    audio: Annotated[
        AudioOutput, honoured("the voice and format of audio output (with modalities naming audio)")
    ] | None = None
    function_call: Annotated[Refused, rejected("it is deprecated; use tool_choice")] = None
    functions: Annotated[Refused, rejected("it is deprecated; use tools")] = None
    logprobs: Annotated[bool, honoured("log probabilities of the sampled tokens")] = False
    top_logprobs: Annotated[
        int, honoured("the most likely alternatives at each position, with logprobs", ge=0, le=MAX_TOP_LOGPROBS)
    ] | None = None
    max_completion_tokens: Annotated[
        int, honoured("the most tokens to generate (wins over max_tokens)", ge=1)
    ] | None = None
    metadata: Annotated[
        dict[str, str] | None,
        informational("tags for stored completions; nothing is stored and it changes no output", STRING_MAP),
    ] = None
    modalities_sent: Annotated[
        Annotated[list[Modality], Meta(min_length=1)],
        honoured(
            "the output modalities: text, image on a model with a vision decoder, audio on one with an audio decoder"
        ),
    ] | None = field(name="modalities", default=None)
    image_sent: Annotated[
        ChatImageOptions,
        honoured("how the images the model draws are drawn and returned (an extension, shaped like audio)"),
    ] | None = field(name="image", default=None)
    moderation: Annotated[Refused, rejected("no moderation model runs on the input or the output")] = None
    parallel_tool_calls: Annotated[bool, honoured("whether one turn may call several tools")] = True
    prediction: Annotated[Refused, rejected("predicted outputs are not implemented")] = None
    prompt_cache_key: Annotated[
        str | None,
        informational(
            "a cache-routing hint; the prefix cache matches prompts by content, and it changes no output", STRING
        ),
    ] = None
    prompt_cache_options: Annotated[
        Refused, rejected("the prefix cache is automatic: explicit breakpoints and minimum lifetimes cannot be set")
    ] = None
    prompt_cache_retention: Annotated[
        Refused,
        default_only(
            "cached prefixes stay in memory until evicted; extended (24h) retention is not available", "in_memory"
        ),
    ] = None
    reasoning_effort: Annotated[
        ReasoningEffort,
        honoured("none or minimal skips the template's reasoning block; the effort is a template variable"),
    ] | None = None
    safety_identifier: Annotated[
        str | None, informational("an end-user id for abuse monitoring; it changes no output", STRING)
    ] = None
    service_tier: Annotated[Refused, default_only("there is one processing tier", "auto", "default")] = None
    store: Annotated[Refused, default_only("completions are not stored", False)] = None
    tool_choice: Annotated[
        Literal["none", "auto", "required"] | NamedToolChoice, honoured("none, auto, required or a named function")
    ] | None = None
    tools_sent: Annotated[
        Annotated[list[Tool], Meta(max_length=MAX_TOOLS)], honoured("the functions the model may call")
    ] = field(name="tools", default_factory=list)
    verbosity: Annotated[Refused, rejected("the verbosity of a response is not controllable")] = None
    web_search_options: Annotated[Refused, rejected("there is no web search tool")] = None
    # vLLM's chat fields
    # the reply starts with the last message's content when it is the assistant's
    echo: Annotated[bool, honoured("the reply starts with the last message when that is the assistant's")] = False
    add_generation_prompt: Annotated[bool, honoured("the template's opening of the assistant's turn")] | None = None
    continue_final_message: Annotated[
        bool, honoured("the reply continues the final (assistant) message")
    ] = False
    add_special_tokens: Annotated[
        Refused, default_only("the chat template writes the special tokens itself (vLLM's chat default)", False)
    ] = None
    documents: Annotated[
        list[dict[str, Any]],
        honoured("passed to the chat template, for templates that render retrieved documents"),
    ] = field(default_factory=list)
    chat_template: Annotated[
        str,
        honoured(
            "a Jinja template used instead of the model's (at most 64 KiB; refused unless the server trusts "
            "request templates)",
            pattern=r"\S",
        ),
    ] | None = None
    chat_template_kwargs: Annotated[
        dict[str, Any],
        honoured(
            "extra variables for the chat template",
            extra_json_schema={"propertyNames": {"not": {"enum": sorted(RESERVED_TEMPLATE_KWARGS)}}},
        ),
    ] = field(
        default_factory=dict
    )
    media_io_kwargs: Annotated[Refused, rejected("media loading options are server settings")] = None
    mm_processor_kwargs: Annotated[Refused, rejected("media preprocessing options are server settings")] = None
    return_prompt_text: Annotated[Refused, default_only("the rendered prompt is not returned", False)] = None
    include_reasoning: Annotated[
        Refused, default_only("reasoning text is always included in the reply", True)
    ] = None

    # Names the prompt in context-length errors.
    prompt_param: ClassVar[str] = "messages"
    logprobs_param: ClassVar[str] = "top_logprobs"  # the field num_logprobs comes from

    def __post_init__(self) -> None:
        if self.max_completion_tokens is not None:  # it wins; max_tokens is still validated
            force_setattr(self, "max_tokens", self.max_completion_tokens)

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    @property
    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None, or how many alternatives besides the sampled token."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def modalities(self) -> tuple[str, ...]:
        return ("text",) if self.modalities_sent is None else tuple(dict.fromkeys(self.modalities_sent))

    @property
    def images_allowed(self) -> bool:
        """The model may draw images: modalities was not given, or names "image". (OpenAI's
        modalities know text and audio; an image the model draws on its own is part of its turn.)"""
        return self.modalities_sent is None or "image" in self.modalities_sent

    @property
    def image(self) -> ChatImageOptions | None:
        """How drawn images are drawn and handed back."""
        return self.image_sent

    @property
    def grammar(self) -> GrammarSpec | None:
        """response_format, structured_outputs, guided_*"""
        return grammar_of(self)

    @property
    def tools(self) -> ToolFields:
        return tool_fields(self.tools_sent, self.tool_choice, self.parallel_tool_calls)

    @property
    def template(self) -> TemplateFields:
        add = self.add_generation_prompt
        return TemplateFields(
            chat_template=self.chat_template,
            # the client's own variables win over what its reasoning_effort sets
            kwargs=effort_template_kwargs(self.reasoning_effort) | self.chat_template_kwargs,
            documents=tuple(self.documents),
            add_generation_prompt=not self.continue_final_message if add is None else add,
            continue_final_message=self.continue_final_message,
        )

    @property
    def template_messages(self) -> list[dict[str, Json]]:
        return [m.to_template_dict() for m in self.messages]


# ----------------------------------------------------------------------------- rules between fields


def check_item_count(raw: Json) -> None:
    """Before conversion: a body of too many messages and parts is refused unread, and an
    earlier turn's calls or audio on a message that is not the assistant's is named as such
    (not by what its objects lack)."""
    if not isinstance(raw, list):
        return
    parts = sum(len(m["content"]) for m in raw if isinstance(m, dict) and isinstance(m.get("content"), list))
    if len(raw) + parts > MAX_CHAT_ITEMS:
        what = f"{len(raw)} messages" + (f" and {parts} content parts" if parts else "")
        raise bad_request(
            f"Invalid 'messages': too long. Expected at most {MAX_CHAT_ITEMS} messages and "
            f"content parts in all, but got {what}.",
            param="messages",
            code="array_above_max_length",
        )
    for i, m in enumerate(raw):
        if isinstance(m, dict) and m.get("role") != "assistant":
            if m.get("tool_calls") is not None:
                raise type_error(f"messages[{i}].tool_calls", "an array of objects on an assistant message", m["tool_calls"])
            if m.get("audio") is not None:
                raise type_error(f"messages[{i}].audio", "an object with an id, on an assistant message", m["audio"])


def check_messages(messages: tuple[ChatMessage, ...]) -> None:
    for i, m in enumerate(messages):
        param = f"messages[{i}]"
        if m.content is None and m.role != "assistant":
            raise missing(f"{param}.content")
        if isinstance(m.content, tuple) and m.role != "user" and not all(isinstance(p, TextPart) for p in m.content):
            raise value_error(f"{param}.content", f"a {m.role} message may only contain text parts.")


def check_chat_request(req: ChatCompletionRequest) -> None:
    """The rules between fields, in the order the 400s are given."""
    check_messages(req.messages)
    check_image_options(req.image)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
    grammar = req.grammar
    tools = req.tools  # raises on a tool_choice that names no tool
    if tools.forced and grammar is not None:
        raise bad_request(
            f"'tool_choice' {tools.choice} already constrains the output; '{grammar.param}' cannot be added.",
            param=grammar.param,
        )
    if req.chat_template is not None and len(req.chat_template.encode()) > MAX_TEMPLATE_BYTES:
        raise value_error("chat_template", f"must be a non-empty template of at most {MAX_TEMPLATE_BYTES} bytes.")
    reserved = sorted(set(req.chat_template_kwargs) & RESERVED_TEMPLATE_KWARGS)
    if reserved:
        raise value_error(
            "chat_template_kwargs", f"'{reserved[0]}' is set by the server; use the request field of that name."
        )
    if req.continue_final_message and req.add_generation_prompt:
        raise bad_request(
            "'continue_final_message' and 'add_generation_prompt' cannot both be true.",
            param="continue_final_message",
            code="invalid_value",
        )
    if req.continue_final_message and req.messages[-1].role != "assistant":
        raise value_error("continue_final_message", "the last message must be the assistant's to continue it.")
    # Audio output needs the voice and format (as OpenAI requires), and a stream carries pcm16
    # only; a model with an audio decoder is checked by the lifecycle, as for images.
    if "audio" in req.modalities:
        if req.audio is None:
            raise bad_request('modalities with "audio" needs the \'audio\' parameter (voice and format).', param="audio")
        if req.stream and req.audio.format != "pcm16":
            raise value_error("audio.format", f"'{req.audio.format}'; a streamed answer's audio is pcm16.")
