"""The Realtime API's client events, as OpenAI's GA API names and shapes them (the openai
package's types/realtime/*_event_param.py), declared once as msgspec Structs: a field no Struct
declares is an error naming it, and every value is checked on arrival.

parse_event() reads one WebSocket text frame: its type picks the Struct (an unknown type is an
error naming it); msgspec's path becomes the error's param, as in the HTTP API's 400s.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
import orjson
from msgspec import UNSET, Meta, Struct, UnsetType

from omni.errors import APIError, bad_request
from omni.serving.requests.fields import convert
from omni.shared.sampling_bounds import sampling_bound

FormatType = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]


class AudioFormat(Struct, forbid_unknown_fields=True):
    """audio/pcm: 16-bit little-endian mono at 24 kHz; audio/pcmu and audio/pcma: G.711 at 8 kHz."""

    type: FormatType = "audio/pcm"
    rate: Literal[24000] | UnsetType = UNSET  # audio/pcm's, and only 24000

    @property
    def sample_rate(self) -> int:
        return 24000 if self.type == "audio/pcm" else 8000

    def json(self) -> dict[str, Any]:
        return {"type": self.type, "rate": 24000} if self.type == "audio/pcm" else {"type": self.type}


class ServerVad(Struct, tag_field="type", tag="server_vad", forbid_unknown_fields=True):
    threshold: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.5
    prefix_padding_ms: Annotated[int, Meta(ge=0, le=5000)] = 300
    silence_duration_ms: Annotated[int, Meta(ge=0, le=10000)] = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: Annotated[int, Meta(ge=1000, le=600000)] | None = None


class SemanticVad(Struct, tag_field="type", tag="semantic_vad", forbid_unknown_fields=True):
    """The end of a turn from what was said as well as from silence (turn_detection.py's
    SemanticTurnDetector): auto is medium, as OpenAI has it."""

    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True


TurnDetection = ServerVad | SemanticVad


class InputTranscription(Struct, forbid_unknown_fields=True):
    model: str | None = None  # informational: the served model transcribes
    language: Annotated[str, Meta(min_length=2, max_length=16)] | None = None
    prompt: str | None = None


class AudioInput(Struct, forbid_unknown_fields=True):
    format: AudioFormat | UnsetType = UNSET
    transcription: InputTranscription | None | UnsetType = UNSET
    turn_detection: TurnDetection | None | UnsetType = UNSET
    noise_reduction: None | UnsetType = UNSET  # only off: the model hears what is sent


class AudioOutput(Struct, forbid_unknown_fields=True):
    format: AudioFormat | UnsetType = UNSET
    voice: str | UnsetType = UNSET
    speed: Annotated[float, Meta(ge=1.0, le=1.0)] | UnsetType = UNSET  # only 1.0: the vocoder has no tempo


class SessionAudio(Struct, forbid_unknown_fields=True):
    input: AudioInput | UnsetType = UNSET
    output: AudioOutput | UnsetType = UNSET


class FunctionTool(Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | UnsetType = UNSET
    parameters: dict[str, Any] | UnsetType = UNSET


class ToolChoiceFunction(Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    name: str


ToolChoice = Literal["auto", "none", "required"] | ToolChoiceFunction
Modalities = Annotated[list[Literal["text", "audio"]], Meta(min_length=1, max_length=1)]
MaxTokens = Annotated[int, Meta(ge=1, le=1 << 20)] | Literal["inf"]
# chat's fields, bounded as chat bounds them (a response is a chat request)
Temperature = Annotated[float, Meta(**sampling_bound("temperature"))]
LogitBias = dict[str, Annotated[float, Meta(**sampling_bound("logit_bias_values"))]]


class SessionFields(Struct, forbid_unknown_fields=True):
    """session.update's session: each field given replaces the session's (audio's by its parts)."""

    type: Literal["realtime"] | UnsetType = UNSET
    model: str | UnsetType = UNSET  # only the connected model's name, or an alias of it
    instructions: str | UnsetType = UNSET
    output_modalities: Modalities | UnsetType = UNSET
    audio: SessionAudio | UnsetType = UNSET
    tools: list[FunctionTool] | UnsetType = UNSET
    tool_choice: ToolChoice | UnsetType = UNSET
    temperature: Temperature | UnsetType = UNSET  # ours (beta's); GA has none
    max_output_tokens: MaxTokens | UnsetType = UNSET
    parallel_tool_calls: bool | UnsetType = UNSET
    truncation: Literal["auto", "disabled"] | UnsetType = UNSET  # auto: the oldest left out (truncation.py)
    tracing: None | Literal["auto"] | UnsetType = UNSET  # informational: no traces are kept
    include: list[Literal["item.input_audio_transcription.logprobs"]] | UnsetType = UNSET  # informational
    # ours, as chat's (vLLM's) fields: reproducible answers, and a bias a test steers a random model with
    seed: int | UnsetType = UNSET
    logit_bias: LogitBias | UnsetType = UNSET


class ResponseAudioOutput(Struct, forbid_unknown_fields=True):
    format: AudioFormat | UnsetType = UNSET
    voice: str | UnsetType = UNSET


class ResponseAudio(Struct, forbid_unknown_fields=True):
    output: ResponseAudioOutput | UnsetType = UNSET


class ResponseFields(Struct, forbid_unknown_fields=True):
    """response.create's overrides, for that response only."""

    instructions: str | UnsetType = UNSET
    output_modalities: Modalities | UnsetType = UNSET
    audio: ResponseAudio | UnsetType = UNSET
    tools: list[FunctionTool] | UnsetType = UNSET
    tool_choice: ToolChoice | UnsetType = UNSET
    temperature: Temperature | UnsetType = UNSET
    max_output_tokens: MaxTokens | UnsetType = UNSET
    conversation: Literal["auto", "none"] | UnsetType = UNSET  # none: out of band, the answer not kept
    input: list[Any] | UnsetType = UNSET  # with conversation none: the items the prompt holds instead
    metadata: dict[str, str] | UnsetType = UNSET
    parallel_tool_calls: bool | UnsetType = UNSET
    # ours, as chat's (vLLM's) fields: reproducible answers, and a bias a test steers a random model with
    seed: int | UnsetType = UNSET
    logit_bias: LogitBias | UnsetType = UNSET


# -------------------------------------------------------------------- conversation items


class InputText(Struct, tag_field="type", tag="input_text", forbid_unknown_fields=True):
    text: str


class InputAudio(Struct, tag_field="type", tag="input_audio", forbid_unknown_fields=True):
    audio: str | UnsetType = UNSET  # base64 in the session's input format
    transcript: str | None | UnsetType = UNSET


class InputImage(Struct, tag_field="type", tag="input_image", forbid_unknown_fields=True):
    image_url: str  # a data: URL, or an http(s) URL under chat's remote-media rules
    detail: Literal["auto", "low", "high"] = "auto"  # informational: the encoder reads every image at its own size


class OutputText(Struct, tag_field="type", tag="output_text", forbid_unknown_fields=True):
    text: str


class OutputAudio(Struct, tag_field="type", tag="output_audio", forbid_unknown_fields=True):
    audio: str | UnsetType = UNSET  # not kept: the transcript is the turn
    transcript: str | None | UnsetType = UNSET


ContentPart = InputText | InputAudio | InputImage | OutputText | OutputAudio


class MessageItem(Struct, tag_field="type", tag="message", forbid_unknown_fields=True):
    role: Literal["user", "assistant", "system"]
    content: Annotated[list[ContentPart], Meta(min_length=1)]
    id: Annotated[str, Meta(min_length=1, max_length=64)] | UnsetType = UNSET
    object: Literal["realtime.item"] | UnsetType = UNSET
    status: Literal["completed", "incomplete", "in_progress"] | UnsetType = UNSET


class FunctionCallItem(Struct, tag_field="type", tag="function_call", forbid_unknown_fields=True):
    name: str
    arguments: str
    call_id: str | UnsetType = UNSET
    id: Annotated[str, Meta(min_length=1, max_length=64)] | UnsetType = UNSET
    object: Literal["realtime.item"] | UnsetType = UNSET
    status: Literal["completed", "incomplete", "in_progress"] | UnsetType = UNSET


class FunctionCallOutputItem(Struct, tag_field="type", tag="function_call_output", forbid_unknown_fields=True):
    call_id: str
    output: str
    id: Annotated[str, Meta(min_length=1, max_length=64)] | UnsetType = UNSET
    object: Literal["realtime.item"] | UnsetType = UNSET
    status: Literal["completed", "incomplete", "in_progress"] | UnsetType = UNSET


Item = MessageItem | FunctionCallItem | FunctionCallOutputItem

# -------------------------------------------------------------------- the events


class _Event(Struct, forbid_unknown_fields=True, kw_only=True):
    type: str
    event_id: str | None = None


class SessionUpdate(_Event):
    session: SessionFields = msgspec.field(default_factory=SessionFields)


class AudioAppend(_Event):
    audio: str = ""  # base64 in the session's input format


class AudioCommit(_Event):
    pass


class AudioClear(_Event):
    pass


class ItemCreate(_Event):
    item: Item
    previous_item_id: str | None = None  # "root": first


class ItemRetrieve(_Event):
    item_id: str


class ItemDelete(_Event):
    item_id: str


class ItemTruncate(_Event):
    item_id: str
    content_index: Annotated[int, Meta(ge=0)]
    audio_end_ms: Annotated[int, Meta(ge=0)]


class ResponseCreate(_Event):
    response: ResponseFields = msgspec.field(default_factory=ResponseFields)


class ResponseCancel(_Event):
    response_id: str | None = None


class OutputAudioClear(_Event):
    """output_audio_buffer.clear: WebRTC's; over a WebSocket the client holds the audio."""


EVENTS: dict[str, type[_Event]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": AudioAppend,
    "input_audio_buffer.commit": AudioCommit,
    "input_audio_buffer.clear": AudioClear,
    "conversation.item.create": ItemCreate,
    "conversation.item.retrieve": ItemRetrieve,
    "conversation.item.delete": ItemDelete,
    "conversation.item.truncate": ItemTruncate,
    "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
    "output_audio_buffer.clear": OutputAudioClear,
}


class EventError(Exception):
    """A client event refused: the error event names it (its type, and its event_id when it
    gave one)."""

    def __init__(self, error: APIError, event_type: str | None, event_id: str | None) -> None:
        super().__init__(error.message)
        self.error = error
        self.event_type = event_type
        self.event_id = event_id


def parse_event(frame: str | bytes) -> _Event:
    try:
        data = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise EventError(bad_request(f"The event is not JSON: {exc}.", code="invalid_json"), None, None) from None
    if not isinstance(data, dict):
        raise EventError(bad_request("An event is a JSON object.", code="invalid_event"), None, None)
    kind, event_id = data.get("type"), data.get("event_id")
    event_id = event_id if isinstance(event_id, str) else None
    cls = EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        error = bad_request(
            f"Invalid value: {kind!r}. Supported values are: {', '.join(map(repr, EVENTS))}.",
            param="type", code="invalid_value",
        )  # fmt: skip
        raise EventError(error, kind if isinstance(kind, str) else None, event_id)
    try:
        return convert(data, cls)
    except APIError as exc:
        raise EventError(exc, kind, event_id) from None
    except msgspec.MsgspecError as exc:  # pragma: no cover - convert maps validation errors
        raise EventError(bad_request(str(exc)), kind, event_id) from None
