"""The body of POST /v1/chat/completions: messages and their content parts, output modalities."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeAlias

import orjson

from omni.errors import bad_request
from omni.serving.requests.fields import (
    Body,
    GenerationFields,
    Json,
    missing,
    opt_bool,
    opt_int,
    opt_object,
    opt_str,
    parse_generation_fields,
    required_str,
    type_error,
    value_error,
)
from omni.serving.requests.images import ChatImageOptions, parse_chat_image_options
from omni.serving.requests.dispositions import check_fields
from omni.serving.requests.structured import parse_grammar
from omni.serving.requests.tools import ToolFields, parse_tool_fields
from omni.text.constrained.spec import GrammarSpec

MAX_TOP_LOGPROBS = 20
# Messages and content parts in one request, in all. Azure OpenAI takes at most 2048 messages;
# this is far past any conversation a context holds, and keeps a 60 MB body of half a million
# tiny messages from costing seconds of parsing, rendering and freeing.
MAX_CHAT_ITEMS = 16_384

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MODALITIES = frozenset({"text", "image", "audio"})
AUDIO_FORMATS = frozenset({"wav", "mp3", "flac", "opus", "pcm16", "aac"})


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
    # For the chat template; each call's arguments parsed from their JSON text into an object,
    # as Hugging Face templates iterate them.
    tool_calls: tuple[Mapping[str, Json], ...] = ()
    reasoning_content: str | None = None  # an earlier turn's reasoning, for templates that show it
    # An earlier spoken answer referred to by its id (OpenAI's assistant {"audio": {"id"}}): its
    # stored transcript becomes the turn's text (omni/serving/spoken.py recall_spoken).
    audio_id: str | None = None

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


def _parse_part(value: Json, param: str) -> ContentPart:
    if not isinstance(value, dict):
        raise type_error(param, "an object", value)
    part_type = required_str(value, "type", f"{param}.type")
    if part_type == "text":
        return TextPart(required_str(value, "text", f"{param}.text"))
    if part_type in ("image_url", "video_url"):
        inner = value.get(part_type)
        if isinstance(inner, str):  # some clients send the URL directly
            url, detail = inner, None
        elif isinstance(inner, dict):
            url = required_str(inner, "url", f"{param}.{part_type}.url")
            detail = opt_str(inner, "detail", f"{param}.{part_type}.detail")
        else:
            raise type_error(f"{param}.{part_type}", "an object", inner)
        return ImageURLPart(url, detail) if part_type == "image_url" else VideoURLPart(url)
    if part_type == "input_audio":
        inner = value.get("input_audio")
        if not isinstance(inner, dict):
            raise type_error(f"{param}.input_audio", "an object", inner)
        return InputAudioPart(
            data=required_str(inner, "data", f"{param}.input_audio.data"),
            format=required_str(inner, "format", f"{param}.input_audio.format"),
        )
    raise value_error(
        f"{param}.type",
        f"unsupported content part type '{part_type}'; "
        "expected text, image_url, input_audio or video_url.",
    )


def _parse_message(value: Json, param: str) -> ChatMessage:
    if not isinstance(value, dict):
        raise type_error(param, "an object", value)
    role = required_str(value, "role", f"{param}.role")
    if role not in ROLES:
        roles = ", ".join(sorted(ROLES))
        raise value_error(f"{param}.role", f"'{role}'; supported roles are {roles}.")
    raw = value.get("content")
    content: str | tuple[ContentPart, ...] | None
    if raw is None:
        if role != "assistant":
            raise missing(f"{param}.content")
        content = None
    elif isinstance(raw, str):
        content = raw
    elif isinstance(raw, list):
        if not raw:
            raise value_error(f"{param}.content", "a content array must not be empty.")
        content = tuple(_parse_part(p, f"{param}.content[{i}]") for i, p in enumerate(raw))
        if role != "user" and not all(isinstance(p, TextPart) for p in content):
            raise value_error(f"{param}.content", f"a {role} message may only contain text parts.")
    else:
        raise type_error(f"{param}.content", "a string or an array of content parts", raw)
    tool_calls = value.get("tool_calls")
    if tool_calls is not None and (role != "assistant" or not isinstance(tool_calls, list)):
        raise type_error(f"{param}.tool_calls", "an array of objects on an assistant message", tool_calls)
    reasoning = opt_str(value, "reasoning_content", f"{param}.reasoning_content")
    if reasoning is None:
        reasoning = opt_str(value, "reasoning", f"{param}.reasoning")
    audio_id = None
    audio = value.get("audio")
    if audio is not None:
        if role != "assistant" or not isinstance(audio, dict):
            raise type_error(f"{param}.audio", "an object with an id, on an assistant message", audio)
        audio_id = required_str(audio, "id", f"{param}.audio.id")
        if not audio_id.startswith("audio_") or not audio_id[6:].isalnum():
            raise value_error(f"{param}.audio.id", f"'{audio_id}' is not the id of a spoken answer.")
    return ChatMessage(
        role=role,
        content=content,
        name=opt_str(value, "name", f"{param}.name"),
        tool_call_id=opt_str(value, "tool_call_id", f"{param}.tool_call_id"),
        tool_calls=tuple(_parse_tool_call(c, f"{param}.tool_calls[{i}]") for i, c in enumerate(tool_calls or ())),
        reasoning_content=reasoning,
        audio_id=audio_id,
    )


def _parse_tool_call(value: Json, param: str) -> dict[str, Json]:
    """An assistant's earlier call, for the template: its arguments text parsed to an object."""
    if not isinstance(value, dict):
        raise type_error(param, "an object", value)
    fn = value.get("function")
    if not isinstance(fn, dict):
        raise type_error(f"{param}.function", "an object", fn)
    name = required_str(fn, "name", f"{param}.function.name")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = orjson.loads(args or "{}")
        except orjson.JSONDecodeError as e:
            raise value_error(f"{param}.function.arguments", f"not JSON: {e}") from None
    if not isinstance(args, dict):
        raise type_error(f"{param}.function.arguments", "a JSON object (as text)", args)
    call: dict[str, Json] = {"type": "function", "function": {"name": name, "arguments": args}}
    if value.get("id") is not None:
        call["id"] = required_str(value, "id", f"{param}.id")
    return call


@dataclass(frozen=True, slots=True)
class AudioOutput:
    voice: str
    format: str


# Variables the server itself passes to every template; chat_template_kwargs may not set them.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template", "tokenize"}
)
MAX_TEMPLATE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class TemplateFields:
    """How the messages are rendered: vLLM's chat template fields."""

    chat_template: str | None = None  # a per-request template (the server may refuse it)
    kwargs: Mapping[str, Json] = field(default_factory=dict)  # extra template variables
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # the reply continues the last (assistant) message
    documents: tuple[Mapping[str, Json], ...] = ()  # for templates that render retrieved documents


def _parse_template_fields(body: Body) -> TemplateFields:
    template = opt_str(body, "chat_template")
    if template is not None and (not template.strip() or len(template.encode()) > MAX_TEMPLATE_BYTES):
        raise value_error("chat_template", f"must be a non-empty template of at most {MAX_TEMPLATE_BYTES} bytes.")
    kwargs = opt_object(body, "chat_template_kwargs") or {}
    reserved = sorted(set(kwargs) & RESERVED_TEMPLATE_KWARGS)
    if reserved:
        raise value_error(
            "chat_template_kwargs", f"'{reserved[0]}' is set by the server; use the request field of that name."
        )
    add = opt_bool(body, "add_generation_prompt")
    cont = bool(opt_bool(body, "continue_final_message"))
    if cont and add:
        raise bad_request(
            "'continue_final_message' and 'add_generation_prompt' cannot both be true.",
            param="continue_final_message",
            code="invalid_value",
        )
    documents = body.get("documents")
    if documents is not None and (not isinstance(documents, list) or not all(isinstance(d, dict) for d in documents)):
        raise type_error("documents", "an array of objects", documents)
    return TemplateFields(
        chat_template=template,
        kwargs=dict(kwargs),
        documents=tuple(documents or ()),
        add_generation_prompt=not cont if add is None else add,
        continue_final_message=cont,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatCompletionRequest(GenerationFields):
    model: str
    messages: tuple[ChatMessage, ...]
    logprobs: bool = False
    top_logprobs: int | None = None
    modalities: tuple[str, ...] = ("text",)
    audio: AudioOutput | None = None
    # The model may draw images: modalities was not given, or names "image". (OpenAI's
    # modalities know text and audio; an image the model draws on its own is part of its turn.)
    images_allowed: bool = True
    # The model may speak: modalities was not given (an audio span it opens on its own is
    # spoken), or names "audio" (then `audio` says the voice and format, and the turn is spoken).
    audio_allowed: bool = True
    image: ChatImageOptions | None = None  # how drawn images are drawn and handed back
    grammar: GrammarSpec | None = None  # response_format, structured_outputs, guided_*
    tools: ToolFields = field(default_factory=ToolFields)
    template: TemplateFields = field(default_factory=lambda: TemplateFields())
    echo: bool = False  # vLLM: the reply starts with the last message's content when it is the assistant's

    # Names the prompt in context-length errors.
    prompt_param: ClassVar[str] = "messages"
    logprobs_param: ClassVar[str] = "top_logprobs"  # the field num_logprobs comes from

    @property
    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None, or how many alternatives besides the sampled token."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def template_messages(self) -> list[dict[str, Json]]:
        return [m.to_template_dict() for m in self.messages]


def _check_item_count(raw: list[Json]) -> None:
    parts = sum(len(m["content"]) for m in raw if isinstance(m, dict) and isinstance(m.get("content"), list))
    if len(raw) + parts > MAX_CHAT_ITEMS:
        what = f"{len(raw)} messages" + (f" and {parts} content parts" if parts else "")
        raise bad_request(
            f"Invalid 'messages': too long. Expected at most {MAX_CHAT_ITEMS} messages and "
            f"content parts in all, but got {what}.",
            param="messages",
            code="array_above_max_length",
        )


def parse_chat_completion_request(body: Body) -> ChatCompletionRequest:
    check_fields(body, "chat")  # a field of neither API, or a value this server cannot honour
    model = required_str(body, "model")
    raw = body.get("messages")
    if raw is None:
        raise missing("messages")
    if not isinstance(raw, list):
        raise type_error("messages", "an array", raw)
    if not raw:
        raise value_error("messages", "must contain at least one message.")
    _check_item_count(raw)
    messages = tuple(_parse_message(m, f"messages[{i}]") for i, m in enumerate(raw))

    logprobs = bool(opt_bool(body, "logprobs"))
    top_logprobs = opt_int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if top_logprobs is not None and not logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
    grammar = parse_grammar(body)
    tools = parse_tool_fields(body)
    if tools.forced and grammar is not None:
        raise bad_request(
            f"'tool_choice' {tools.choice} already constrains the output; '{grammar.param}' cannot be added.",
            param=grammar.param,
        )
    template = _parse_template_fields(body)
    if template.continue_final_message and messages[-1].role != "assistant":
        raise value_error("continue_final_message", "the last message must be the assistant's to continue it.")
    modalities, audio = _parse_output_modalities(body)
    return ChatCompletionRequest(
        images_allowed=body.get("modalities") is None or "image" in modalities,
        audio_allowed=body.get("modalities") is None or "audio" in modalities,
        image=parse_chat_image_options(body),
        model=model,
        messages=messages,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        modalities=modalities,
        audio=audio,
        grammar=grammar,
        tools=tools,
        template=template,
        echo=bool(opt_bool(body, "echo")),
        **parse_generation_fields(body),
    )


def _parse_output_modalities(body: Body) -> tuple[tuple[str, ...], AudioOutput | None]:
    raw = body.get("modalities")
    if raw is None:
        modalities: tuple[str, ...] = ("text",)
    elif not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
        raise type_error("modalities", "an array of strings", raw)
    elif not raw or not set(raw) <= MODALITIES:
        supported = ", ".join(sorted(MODALITIES))
        raise value_error("modalities", f"{raw}; each must be one of {supported}.")
    else:
        modalities = tuple(dict.fromkeys(raw))  # de-duplicated, order kept
    audio_body = opt_object(body, "audio")
    audio = None
    if audio_body is not None:
        # Checked even though audio cannot be produced yet, so a malformed object gets
        # its own 400 rather than the one below.
        audio = AudioOutput(
            voice=required_str(audio_body, "voice", "audio.voice"),
            format=required_str(audio_body, "format", "audio.format"),
        )
        if audio.format not in AUDIO_FORMATS:
            supported = ", ".join(sorted(AUDIO_FORMATS))
            raise value_error("audio.format", f"'{audio.format}'; supported: {supported}.")
    # Audio output needs the voice and format (as OpenAI requires), and a stream carries pcm16
    # only; a model with an audio decoder is checked by the lifecycle, as for images.
    if "audio" in modalities:
        if audio is None:
            raise bad_request('modalities with "audio" needs the \'audio\' parameter (voice and format).', param="audio")
        if body.get("stream") and audio.format != "pcm16":
            raise value_error("audio.format", f"'{audio.format}'; a streamed answer's audio is pcm16.")
    return modalities, audio
