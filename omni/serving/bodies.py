"""The API's response bodies and streamed events, each field declared once: the handlers build
these Structs and msgspec encodes them, and omni/http/openapi.py's response components are
their JSON schemas (msgspec.json.schema_components of RESPONSE_TYPES).

A field the server leaves out of some bodies is `T | UnsetType = UNSET`, so it is absent from
the JSON (and not required in the schema) rather than null. A constant (`object`, `quality`)
is a Literal with no default, so the schema requires it; a `type` that comes first on the wire
is the Struct's tag. Field order is the order on the wire. The docstrings and descriptions
are the document's; a class name is its component name, so none repeats a request
component's name (TextPart, shared with the requests, is the request's own Struct).

An output kind's own part of a chat body is its chat side's (OutputImagePart in
omni/modalities/outputs/image_chat.py; MessageAudio and AudioDelta in
omni/modalities/outputs/audio_chat.py), declared there and used here.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias, cast

from msgspec import UNSET, Meta, Struct, UnsetType

from omni.engines.generation import Usage as TokenUsage
from omni.modalities.outputs.audio_chat import AudioDelta, MessageAudio
from omni.modalities.outputs.image_chat import ImageDecoderDetails, OutputImagePart
from omni.serving.requests.chat import TextPart
from omni.serving.requests.images import OUTPUT_FORMATS
from omni.serving.requests.transcriptions import MAX_TEMPERATURE

Count: TypeAlias = Annotated[int, Meta(ge=0)]
Logprob: TypeAlias = Annotated[float | None, Meta(description="null: minus infinity.")]
FinishReason: TypeAlias = Literal["stop", "length", "tool_calls", "abort"] | None


def finish_reason(reason: str | None) -> FinishReason:
    """The engine's reason (a str) as the body's: the engine ends a request only for these."""
    return cast(FinishReason, reason)


# The request's output_format, as sent (str typed, so either the request's Literal or a str fits).
OutputFormat: TypeAlias = Annotated[str, Meta(extra_json_schema={"enum": list(OUTPUT_FORMATS)})]
Utf8Bytes: TypeAlias = list[Annotated[int, Meta(ge=0, le=255)]]

# ----------------------------------------------------------------------------- shared pieces


class Usage(Struct, kw_only=True):
    prompt_tokens: Count
    completion_tokens: Count
    total_tokens: Count
    prompt_tokens_details: PromptTokensDetails
    # Ours: a chat completion's, when its choices drew images (the images API's usage has the same)
    decoder_details: ImageDecoderDetails | UnsetType = UNSET


class PromptTokensDetails(Struct):
    cached_tokens: Count


def usage_body(usage: TokenUsage) -> Usage:
    return Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(usage.cached_tokens),
    )


class LogprobEntry(Struct):
    """A token by its text (or "token_id:N"), its logprob and its text's UTF-8 bytes."""

    token: str
    logprob: Logprob
    bytes: Utf8Bytes


class ChatTokenLogprob(Struct):
    token: str
    logprob: Logprob
    bytes: Utf8Bytes
    top_logprobs: list[LogprobEntry]


class ChatLogprobs(Struct):
    content: list[ChatTokenLogprob]


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[Logprob]
    top_logprobs: list[dict[str, Logprob] | None]
    text_offset: list[Count]


class PromptTokenLogprob(Struct):
    logprob: Logprob
    rank: int
    decoded_token: str


PromptLogprobs: TypeAlias = Annotated[
    list[dict[str, PromptTokenLogprob] | None],
    Meta(description="null for the first prompt token; then token id -> its logprob, rank and text."),
]

# ----------------------------------------------------------------------------- chat completions


class OutputFunction(Struct):
    name: str
    arguments: str


class OutputToolCall(Struct):
    id: str
    type: Literal["function"]
    function: OutputFunction


class ChatCompletionMessage(Struct, kw_only=True):
    role: Literal["assistant"]
    content: Annotated[
        str | list[TextPart | OutputImagePart] | None,
        Meta(description="A turn that drew images: its text part (if it has text), then its images."),
    ]
    tool_calls: list[OutputToolCall] | UnsetType = UNSET
    reasoning_content: str | None | UnsetType = UNSET
    # the same text under vLLM's newer name (0.11.2 on), so clients reading either find it
    reasoning: str | None | UnsetType = UNSET
    audio: MessageAudio | UnsetType = UNSET


StopReason: TypeAlias = Annotated[
    int | str | None,
    Meta(description="What ended the choice (vLLM's): the stop string hit or the stop_token_ids id sampled; null otherwise."),
]


class ChatChoice(Struct):
    index: Count
    message: ChatCompletionMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason
    stop_reason: StopReason = None


class ChatCompletion(Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"]
    created: Count
    model: str
    choices: list[ChatChoice]
    prompt_logprobs: PromptLogprobs | UnsetType = UNSET
    usage: Usage


class FunctionDelta(Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str


class ToolCallDelta(Struct, kw_only=True):
    """One streamed piece of a call: the first carries its id and name; the arguments of all
    its pieces concatenate to the call's."""

    index: Count
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionDelta


class ChunkDelta(Struct, kw_only=True):
    role: Literal["assistant"] | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET  # the same text under vLLM's newer name
    content: Annotated[
        str | list[OutputImagePart] | UnsetType,
        Meta(description="Text, or in a chunk of its own the images the tokens so far drew."),
    ] = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET
    audio: AudioDelta | UnsetType = UNSET


class ChatChunkChoice(Struct):
    index: Count
    delta: ChunkDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason
    stop_reason: StopReason | UnsetType = UNSET  # on the chunk that finishes the choice


ChunkUsage: TypeAlias = Annotated[
    Usage | None | UnsetType, Meta(description="With stream_options.include_usage: null until the last chunk.")
]


class ChatCompletionChunk(Struct):
    id: str
    object: Literal["chat.completion.chunk"]
    created: Count
    model: str
    choices: list[ChatChunkChoice]
    usage: ChunkUsage = UNSET


# ----------------------------------------------------------------------------- text completions


class TextChoice(Struct, kw_only=True):
    index: Count
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason
    stop_reason: StopReason | UnsetType = UNSET  # always when not streamed; on a stream's last chunk
    prompt_logprobs: PromptLogprobs | UnsetType = UNSET


class TextCompletion(Struct, kw_only=True):
    id: str
    object: Literal["text_completion"]
    created: Count
    model: str
    choices: list[TextChoice]
    usage: Usage


class TextCompletionChunk(Struct):
    id: str
    object: Literal["text_completion"]
    created: Count
    model: str
    choices: list[TextChoice]
    usage: ChunkUsage = UNSET


# ----------------------------------------------------------------------------- images


class ImageTokensDetails(Struct):
    text_tokens: Count
    image_tokens: Count


class ImageUsage(Struct):
    input_tokens: Count
    input_tokens_details: ImageTokensDetails
    output_tokens: Annotated[Count, Meta(description="The image spans' tokens, all n of them.")]
    total_tokens: Count
    decoder_details: ImageDecoderDetails | UnsetType = UNSET


class ImageData(Struct):
    url: str | UnsetType = UNSET
    b64_json: str | UnsetType = UNSET


Size: TypeAlias = Annotated[str, Meta(pattern="^[0-9]+x[0-9]+$", description="WIDTHxHEIGHT, as drawn.")]


class ImagesResponse(Struct, kw_only=True):
    """As the official client's ImagesResponse reads it."""

    created: Count
    data: list[
        Annotated[
            ImageData,
            Meta(
                description="By response_format: a signed URL, or the image's bytes in base64.",
                extra_json_schema={"oneOf": [{"required": ["url"]}, {"required": ["b64_json"]}]},
            ),
        ]
    ]
    output_format: OutputFormat
    size: Size
    quality: Literal["auto"]
    background: Literal["opaque"]
    usage: ImageUsage


class ImageGenPartialImageEvent(Struct, kw_only=True, tag_field="type", tag="image_generation.partial_image"):
    """An intermediate denoising step's image (partial_images of them per image)."""

    partial_image_index: Count
    size: Size
    b64_json: str
    created_at: Count
    output_format: OutputFormat
    quality: Literal["auto"]
    background: Literal["opaque"]


class ImageGenCompletedEvent(Struct, kw_only=True, tag_field="type", tag="image_generation.completed"):
    """One per image, as b64_json whatever response_format."""

    b64_json: str
    created_at: Count
    output_format: OutputFormat
    quality: Literal["auto"]
    background: Literal["opaque"]
    size: Size
    usage: ImageUsage


class ImageEditPartialImageEvent(Struct, kw_only=True, tag_field="type", tag="image_edit.partial_image"):
    """An intermediate denoising step's edited image (partial_images of them per image)."""

    partial_image_index: Count
    size: Size
    b64_json: str
    created_at: Count
    output_format: OutputFormat
    quality: Literal["auto"]
    background: Literal["opaque"]


class ImageEditCompletedEvent(Struct, kw_only=True, tag_field="type", tag="image_edit.completed"):
    """One per edited image, as b64_json whatever response_format."""

    b64_json: str
    created_at: Count
    output_format: OutputFormat
    quality: Literal["auto"]
    background: Literal["opaque"]
    size: Size
    usage: ImageUsage


# ----------------------------------------------------------------------------- audio

TranscriptLogprobs: TypeAlias = Annotated[list[LogprobEntry], Meta(description="With include [logprobs].")]


class TranscriptionTokenDetails(Struct):
    text_tokens: Count
    audio_tokens: Count


class TranscriptionUsage(Struct, tag_field="type", tag="tokens"):
    input_tokens: Count
    input_token_details: TranscriptionTokenDetails
    output_tokens: Count
    total_tokens: Count


class Transcription(Struct, kw_only=True):
    """response_format json, as the official client's Transcription reads it."""

    text: str
    logprobs: TranscriptLogprobs | UnsetType = UNSET
    usage: TranscriptionUsage


class TranscriptionSegment(Struct, kw_only=True):
    """The whole clip: the model writes no timestamps."""

    id: Literal[0]
    seek: Literal[0]
    start: Annotated[float, Meta(ge=0, le=0)]
    end: Annotated[float, Meta(ge=0, description="The clip's duration.")]
    text: str
    tokens: list[Count]
    temperature: Annotated[float, Meta(ge=0.0, le=MAX_TEMPERATURE)]
    avg_logprob: Annotated[float, Meta(le=0)]
    compression_ratio: Annotated[float, Meta(ge=0, description="Whisper's: the text's bytes over their zlib size.")]
    no_speech_prob: Annotated[float, Meta(ge=0, le=0, description="The model has no no-speech estimate.")]


class DurationUsage(Struct, tag_field="type", tag="duration"):
    seconds: Annotated[float, Meta(ge=0)]


class TranscriptionVerbose(Struct, kw_only=True, tag_field="task", tag="transcribe"):
    """response_format verbose_json, as the official client's TranscriptionVerbose reads it."""

    language: Annotated[str, Meta(description="The request's language, or unknown.")]
    duration: Annotated[float, Meta(ge=0, description="Seconds, from the audio encoder's rows (25 a second).")]
    text: str
    segments: Annotated[
        list[TranscriptionSegment],
        Meta(min_length=1, max_length=1, description="One segment, the whole clip: the model gives no timestamps."),
    ]
    usage: DurationUsage


class TranscriptTextDeltaEvent(Struct, kw_only=True, tag_field="type", tag="transcript.text.delta"):
    delta: str
    logprobs: TranscriptLogprobs | UnsetType = UNSET


class TranscriptTextDoneEvent(Struct, kw_only=True, tag_field="type", tag="transcript.text.done"):
    text: Annotated[str, Meta(description="The deltas joined.")]
    logprobs: TranscriptLogprobs | UnsetType = UNSET
    usage: TranscriptionUsage


class SpeechAudioDeltaEvent(Struct, tag_field="type", tag="speech.audio.delta"):
    audio: Annotated[str, Meta(description="base64 of the audio file's next bytes.")]


class SpeechUsage(Struct):
    input_tokens: Count
    output_tokens: Count
    total_tokens: Count


class SpeechAudioDoneEvent(Struct, tag_field="type", tag="speech.audio.done"):
    usage: SpeechUsage


# ----------------------------------------------------------------------------- the rest


class Model(Struct, kw_only=True):
    id: str
    object: Literal["model"]
    created: Count
    owned_by: str
    max_model_len: Annotated[int, Meta(ge=1)] | None


class ModelList(Struct, kw_only=True):
    object: Literal["list"]
    data: list[Model]


class Health(Struct, kw_only=True):
    status: Literal["ok", "starting"]
    not_ready: Annotated[list[str], Meta(description="The models still starting.")] | UnsetType = UNSET


class Version(Struct):
    version: str


class TokenizeResponse(Struct, kw_only=True):
    count: Count
    max_model_len: Annotated[
        Annotated[int, Meta(ge=1)] | None, Meta(description="null until the model's worker has started.")
    ]
    tokens: list[Count]
    token_strs: list[str | None] | None


class DetokenizeResponse(Struct):
    prompt: str


# Every body the document describes (the error object is omni.errors'); their schemas are the
# response components.
RESPONSE_TYPES: tuple[type[Struct], ...] = (
    ChatCompletion,
    ChatCompletionChunk,
    TextCompletion,
    TextCompletionChunk,
    ImagesResponse,
    ImageGenPartialImageEvent,
    ImageGenCompletedEvent,
    ImageEditPartialImageEvent,
    ImageEditCompletedEvent,
    Transcription,
    TranscriptionVerbose,
    TranscriptTextDeltaEvent,
    TranscriptTextDoneEvent,
    SpeechAudioDeltaEvent,
    SpeechAudioDoneEvent,
    ModelList,
    Health,
    Version,
    TokenizeResponse,
    DetokenizeResponse,
)
