"""The body of POST /v1/responses, as the official openai client sends it (responses.create).
Each field is declared once (common.py says how); omni/serving/responses/turn.py turns the
request into the chat turn the engine answers.

Input items: messages (content a string, or input_text, input_image, input_audio, input_file
as an image, and an assistant's output_text), function_call and function_call_output,
reasoning and image_generation_call (earlier output given back). Tools: function and
image_generation; tool_choice none, auto, required, a function or image_generation. A type
outside these is a 400 naming where it is (e.g. `input[0].type`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from msgspec import Meta, Struct, field

from omni.errors import bad_request
from omni.serving.requests.common import (
    STRING,
    Priority,
    Refused,
    check_known,
    default_only,
    honoured,
    informational,
    known_fields,
    rejected,
)
from omni.serving.requests.fields import (
    MAX_SEED,
    MIN_SEED,
    Body,
    Json,
    convert,
    value_error,
)
from omni.serving.requests.image_edits import IMAGE_EDIT_FIELDS
from omni.serving.requests.images import (
    IMAGE_FIELDS,
    MAX_PARTIAL_IMAGES,
    Compression,
    OutputFormat,
    Size,
    StepCacheThreshold,
    check_file_options,
)
from omni.serving.requests.reasoning import ReasoningEffort
from omni.serving.requests.tools import MAX_TOOLS, NAME_PATTERN
from omni.shared.media.image_sizes import parse_size
from omni.shared.sampling_bounds import sampling_bound

RESPONSES_PATH = "/v1/responses"
MAX_INPUT_ITEMS = 16_384  # as chat's messages and parts (MAX_CHAT_ITEMS)
MAX_METADATA_KEYS = 16  # OpenAI's bounds on metadata
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512

# ----------------------------------------------------------------------------- content parts


class InputText(Struct, frozen=True, tag_field="type", tag="input_text"):
    text: str


class OutputText(Struct, frozen=True, tag_field="type", tag="output_text"):
    """An assistant message's text, as an earlier response gave it (annotations and logprobs
    come back with it and are not read)."""

    text: str
    annotations: list[Any] = field(default_factory=list)
    logprobs: list[Any] | None = None


class Refusal(Struct, frozen=True, tag_field="type", tag="refusal"):
    refusal: str


class InputImage(Struct, frozen=True, tag_field="type", tag="input_image"):
    image_url: str | None = None  # an http(s) or data: URL
    file_id: str | None = None  # refused: there is no files API
    detail: Literal["auto", "low", "high", "original"] = "auto"


class AudioData(Struct, frozen=True):
    data: str  # base64
    format: str


class InputAudioContent(Struct, frozen=True, tag_field="type", tag="input_audio"):
    input_audio: AudioData


class InputFile(Struct, frozen=True, tag_field="type", tag="input_file"):
    """A file: an image only (its bytes as a data URL or base64, or a URL)."""

    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None
    file_id: str | None = None
    detail: str | None = None


ContentPart: TypeAlias = InputText | OutputText | Refusal | InputImage | InputAudioContent | InputFile


# ----------------------------------------------------------------------------- input items


class Message(Struct, frozen=True, kw_only=True, tag_field="type", tag="message"):
    role: Literal["user", "system", "developer", "assistant"]
    content: str | Annotated[tuple[ContentPart, ...], Meta(min_length=1)]
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class FunctionCallItem(Struct, frozen=True, kw_only=True, tag_field="type", tag="function_call"):
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutput(Struct, frozen=True, kw_only=True, tag_field="type", tag="function_call_output"):
    call_id: str
    output: str | tuple[ContentPart, ...]
    id: str | None = None
    status: str | None = None


class SummaryText(Struct, frozen=True, tag_field="type", tag="summary_text"):
    text: str


class ReasoningText(Struct, frozen=True, tag_field="type", tag="reasoning_text"):
    text: str


class Reasoning(Struct, frozen=True, kw_only=True, tag_field="type", tag="reasoning"):
    summary: list[SummaryText] = field(default_factory=list)
    content: tuple[ReasoningText, ...] | None = None
    id: str | None = None
    encrypted_content: str | None = None
    status: str | None = None


class ImageGenerationCall(Struct, frozen=True, kw_only=True, tag_field="type", tag="image_generation_call"):
    id: str
    result: str | None = None
    status: str | None = None


InputItem: TypeAlias = Message | FunctionCallItem | FunctionCallOutput | Reasoning | ImageGenerationCall


# ----------------------------------------------------------------------------- tools


class FunctionTool(Struct, frozen=True, kw_only=True, tag_field="type", tag="function"):
    name: Annotated[str, Meta(pattern=NAME_PATTERN)]
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ImageGenerationTool(Struct, frozen=True, kw_only=True, tag_field="type", tag="image_generation"):
    """Drawn by the model's image decoder; the result is base64 at this size and format.
    What the decoder has no knob for is taken at its default only (check_image_tool)."""

    size: Size = "auto"
    output_format: OutputFormat = "png"
    output_compression: Compression | None = None
    partial_images: Annotated[int, Meta(ge=0, le=MAX_PARTIAL_IMAGES)] = 0
    step_cache_threshold: StepCacheThreshold | None = None  # ours: the decoder's step cache, as the images API's
    # Taken at the images API's defaults only (_AS_IMAGES_API): the decoder has one quality,
    # draws opaque images, and no moderation model runs; the encoders read every image one way.
    quality: Literal["low", "medium", "high", "auto"] = "auto"
    background: Literal["transparent", "opaque", "auto"] = "auto"
    moderation: Literal["auto", "low"] = "auto"
    input_fidelity: Literal["high", "low"] | None = None
    action: Literal["generate", "edit", "auto"] = "auto"
    # The model that draws, as the images API's `model`: the turn's images are the response's
    # own model's, so it must name that model (omni/serving/responses/turn.py checks it).
    model: str | None = None
    input_image_mask: dict[str, Any] | None = None

    @property
    def parsed_size(self) -> tuple[int, int] | None:
        return None if self.size == "auto" else parse_size(self.size)


ResponseTool: TypeAlias = FunctionTool | ImageGenerationTool


class FunctionChoice(Struct, frozen=True, tag_field="type", tag="function"):
    name: str


class ImageGenerationChoice(Struct, frozen=True, tag_field="type", tag="image_generation"):
    pass


ToolChoice: TypeAlias = Literal["none", "auto", "required"] | FunctionChoice | ImageGenerationChoice


# ----------------------------------------------------------------------------- text and reasoning


class TextFormatText(Struct, frozen=True, tag_field="type", tag="text"):
    pass


class TextFormatJsonObject(Struct, frozen=True, tag_field="type", tag="json_object"):
    pass


class TextFormatJsonSchema(Struct, frozen=True, kw_only=True, tag_field="type", tag="json_schema"):
    name: str
    schema_: dict[str, Any] = field(name="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: TextFormatText | TextFormatJsonObject | TextFormatJsonSchema = TextFormatText()
    verbosity: Literal["medium"] | None = None  # the length of a reply is not controllable


class ReasoningConfig(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """effort: as chat's reasoning_effort (requests/reasoning.py), which the turn's chat request
    carries. summary: the reasoning item carries the model's reasoning text as its summary,
    whatever the detail asked."""

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponseStreamOptions(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    include_obfuscation: Literal[False] | None = None  # events carry no obfuscation padding


# ----------------------------------------------------------------------------- the request


class ResponseRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: Annotated[str, honoured("the served model that answers")]
    input: Annotated[
        str | Annotated[list[InputItem], Meta(min_length=1, max_length=MAX_INPUT_ITEMS)],
        honoured("a user message, or items: messages, function calls and their outputs, earlier output"),
    ] = ""
    instructions: Annotated[str, honoured("a system message before the input (not carried to follow-ups)")] | None = None
    tools: Annotated[
        Annotated[list[ResponseTool], Meta(max_length=MAX_TOOLS)],
        honoured("function tools, and image_generation (the model's image decoder)"),
    ] = field(default_factory=list)
    tool_choice: Annotated[ToolChoice, honoured("none, auto, required, a function, or image_generation")] = "auto"
    parallel_tool_calls: Annotated[bool, honoured("whether one turn may call several functions")] = True
    text: Annotated[TextConfig, honoured("format: text, json_object or json_schema")] | None = None
    reasoning: Annotated[
        ReasoningConfig, honoured("effort none or minimal skips reasoning; the summary is the model's reasoning text")
    ] | None = None
    max_output_tokens: Annotated[int, honoured("the most tokens to generate, reasoning included", ge=1)] | None = None
    temperature: Annotated[float, honoured("the sampling temperature; 0 is greedy", **sampling_bound("temperature"))] = 1.0
    top_p: Annotated[float, honoured("nucleus sampling", **sampling_bound("top_p"))] = 1.0
    metadata: Annotated[dict[str, str], honoured("up to 16 tags, kept with the response")] | None = None
    previous_response_id: Annotated[
        str, honoured("continues a stored response: its turns are rendered before the input")
    ] | None = None
    store: Annotated[bool, honoured("keep the response for GET, follow-ups and cancel, for a bounded time")] = True
    background: Annotated[bool, honoured("answer at once with the response queued; GET it later")] = False
    stream: Annotated[bool, honoured("server-sent events, named by type, each with a sequence_number")] = False
    stream_options: Annotated[ResponseStreamOptions, honoured("include_obfuscation is accepted false only")] | None = None
    include: Annotated[Refused, default_only("no extra output data is available", [])] = None
    truncation: Annotated[Refused, default_only("an input past the context is a 400", "disabled")] = None
    service_tier: Annotated[Refused, default_only("there is one processing tier", "auto", "default")] = None
    prompt_cache_key: Annotated[
        str | None,
        informational("a cache-routing hint; the prefix cache matches prompts by content, and it changes no output", STRING),
    ] = None
    prompt_cache_retention: Annotated[
        Refused, default_only("cached prefixes stay in memory until evicted", "in_memory")
    ] = None
    user: Annotated[str | None, informational("an end-user id for abuse monitoring; it changes no output", STRING)] = None
    safety_identifier: Annotated[
        str | None, informational("an end-user id for abuse monitoring; it changes no output", STRING)
    ] = None
    max_tool_calls: Annotated[Refused, rejected("the number of tool calls in a turn cannot be capped")] = None
    top_logprobs: Annotated[Refused, rejected("log probabilities are not returned by this endpoint")] = None
    prompt: Annotated[Refused, rejected("there are no stored prompt templates")] = None
    conversation: Annotated[Refused, rejected("there is no conversations API; use previous_response_id")] = None
    context_management: Annotated[Refused, rejected("context compaction is not implemented")] = None
    # extensions, as chat's
    seed: Annotated[
        int, honoured("seeds the sampling (an extension)", ge=MIN_SEED, extra_json_schema={"maximum": MAX_SEED})
    ] | None = None
    priority: Priority = 0

    @property
    def image_tool(self) -> ImageGenerationTool | None:
        return next((t for t in self.tools if isinstance(t, ImageGenerationTool)), None)

    @property
    def functions(self) -> list[FunctionTool]:
        return [t for t in self.tools if isinstance(t, FunctionTool)]


RESPONSE_FIELDS = known_fields(ResponseRequest)


def parse_response_request(body: Body) -> ResponseRequest:
    check_known(body, RESPONSE_FIELDS, RESPONSES_PATH)
    req = convert(_typed_messages(body), ResponseRequest, within=("input", "tools", "text", "reasoning"))
    check_response_request(req)
    return req


def _typed_messages(body: Body) -> dict[str, Json]:
    """An input item with a role and no type is a message (OpenAI's EasyInputMessage)."""
    items = body.get("input")
    if not isinstance(items, list):
        return dict(body)
    typed = [
        {"type": "message", **item} if isinstance(item, dict) and "type" not in item and "role" in item else item
        for item in items
    ]
    return {**body, "input": typed}


def check_response_request(req: ResponseRequest) -> None:
    if isinstance(req.input, str) and not req.input and req.previous_response_id is None:
        raise bad_request("Missing required parameter: 'input'.", param="input", code="missing_required_parameter")
    if req.seed is not None and req.seed > MAX_SEED:
        raise value_error("seed", f"must be between {MIN_SEED} and {MAX_SEED}, got {req.seed}.")
    if req.stream_options is not None and not req.stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true.", param="stream_options")
    if req.background and not req.store:
        raise bad_request("A background response must be stored: 'store' cannot be false.", param="store")
    if req.metadata is not None:
        _check_metadata(req.metadata)
    names = [t.name for t in req.functions]
    for i, tool in enumerate(req.tools):
        if isinstance(tool, FunctionTool) and names.count(tool.name) > 1:
            raise value_error(f"tools[{i}].name", f"'{tool.name}' names two tools.")
        if isinstance(tool, ImageGenerationTool):
            _check_image_tool(tool, f"tools[{i}]")
    if sum(isinstance(t, ImageGenerationTool) for t in req.tools) > 1:
        raise value_error("tools", "at most one image_generation tool.")
    choice = req.tool_choice
    if isinstance(choice, FunctionChoice) and choice.name not in names:
        raise value_error("tool_choice.name", f"'{choice.name}' is not one of the tools.")
    if isinstance(choice, ImageGenerationChoice) and req.image_tool is None:
        raise value_error("tool_choice", "image_generation is not one of the tools.")
    if choice == "required" and not req.tools:
        raise value_error("tool_choice", "'required' needs tools.")


def _check_metadata(metadata: dict[str, str]) -> None:
    if len(metadata) > MAX_METADATA_KEYS:
        raise value_error("metadata", f"at most {MAX_METADATA_KEYS} keys, got {len(metadata)}.")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise value_error(
                f"metadata.{key[:MAX_METADATA_KEY]}",
                f"keys are at most {MAX_METADATA_KEY} characters, values at most {MAX_METADATA_VALUE}.",
            )


# The tool's options that the images API takes at their defaults only, judged by its tables: the
# same 400s (unsupported_parameter, the same reason and accepted values), named at the tool's
# field. input_fidelity is an edit's field; generations has none.
_AS_IMAGES_API = {
    "quality": IMAGE_FIELDS["quality"],
    "background": IMAGE_FIELDS["background"],
    "moderation": IMAGE_FIELDS["moderation"],
    "input_fidelity": IMAGE_EDIT_FIELDS["input_fidelity"],
}


def _check_image_tool(tool: ImageGenerationTool, param: str) -> None:
    check_file_options(tool.size, tool.output_format, tool.output_compression, f"{param}.")
    for name, known in _AS_IMAGES_API.items():
        value = getattr(tool, name)
        if value is not None:
            known.check(f"{param}.{name}", value, {})
    if tool.action == "edit":
        raise value_error(f"{param}.action", "editing an input image is POST /v1/images/edits; use 'generate' or 'auto'.")
    if tool.input_image_mask is not None:
        raise value_error(f"{param}.input_image_mask", "masks are taken by POST /v1/images/edits only.")
