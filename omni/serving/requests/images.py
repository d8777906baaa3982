"""The body of POST /v1/images/generations, as the official openai client sends it, and a chat
request's `image` options. Each field is declared once (common.py says how).

OpenAI's fields: prompt, model, n, size, response_format (url | b64_json), output_format (png |
jpeg | webp), output_compression, stream and partial_images (0 to 3), and quality, style,
background and moderation, which this decoder has no knob for: each is accepted only at its
default ("auto"; style has none, so it is refused). The extensions vLLM-style servers take:
seed, num_inference_steps and guidance_scale; and ours, step_cache_threshold (the image decoder's
first-block cache, docs/IMAGES.md). A field of neither is a 400 naming it, as on the other
endpoints.
"""

from __future__ import annotations

import typing
from typing import Annotated, Literal, TypeAlias

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
    convert,
    type_error,
    value_error,
)
from omni.shared.media.image_sizes import ALLOWED_SIZES, parse_size

IMAGES_PATH = "/v1/images/generations"
MAX_IMAGES = 10  # OpenAI's bound on n
MAX_PROMPT_CHARS = 32_000  # OpenAI's, for its newest image model
MAX_STEPS = 100
MAX_GUIDANCE = 20.0
MAX_PARTIAL_IMAGES = 3
# A relative change: FBCache's thresholds for Flux are 0.08 to 0.12; over 1 is for random weights
# (docs/IMAGES.md), and MAX_STEP_CACHE skips every step the decoder lets skip.
MAX_STEP_CACHE = 1000.0

# The drawing options an images request and a chat request's `image` object share.
Size: TypeAlias = Annotated[
    str, Meta(description="auto: the size of the aspect ratio the model picks.", extra_json_schema={"enum": list(ALLOWED_SIZES)})
]
ResponseFormat: TypeAlias = Annotated[
    Literal["url", "b64_json"], Meta(description="url: a signed URL; b64_json: the bytes.")
]
OutputFormat: TypeAlias = Literal["png", "jpeg", "webp"]
RESPONSE_FORMATS: tuple[str, ...] = typing.get_args(typing.get_args(ResponseFormat)[0])
OUTPUT_FORMATS: tuple[str, ...] = typing.get_args(OutputFormat)
Compression: TypeAlias = Annotated[int, Meta(ge=0, le=100, description="The jpeg or webp quality.")]
Steps: TypeAlias = Annotated[int, Meta(ge=1, le=MAX_STEPS, description="Denoising steps; default: the server's.")]
Guidance: TypeAlias = Annotated[float, Meta(ge=0.0, le=MAX_GUIDANCE, description="Default: the checkpoint's.")]
Seed: TypeAlias = Annotated[int, Meta(ge=MIN_SEED, extra_json_schema={"maximum": MAX_SEED})]
StepCacheThreshold: TypeAlias = Annotated[
    float,
    Meta(
        ge=0.0,
        le=MAX_STEP_CACHE,
        description="The image decoder's first-block cache: a denoising step whose first DiT block moved less than "
        "this (relative mean absolute change) since the blocks last ran reuses their residual. 0: off; "
        "default: the server's --image-step-cache.",
    ),
]


class ImageGenerationRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    prompt: Annotated[
        str,
        honoured("what to draw", max_length=MAX_PROMPT_CHARS, extra_json_schema={"pattern": r"\S"}),
    ]
    # None: the server's only image-capable model
    model: Annotated[str | None, honoured("a served model with a vision decoder; null: the only one")] = None
    n: Annotated[int, honoured("how many images to draw", ge=1, le=MAX_IMAGES)] = 1
    size_sent: Annotated[Size | None, honoured("the image's size")] = field(name="size", default=None)
    response_format: Annotated[ResponseFormat, honoured("how the images are handed back")] = "url"
    output_format: Annotated[OutputFormat, honoured("the image file's format")] = "png"
    output_compression: Annotated[Compression | None, honoured("the jpeg or webp quality")] = None
    stream: Annotated[bool, honoured("server-sent events: partial images, then each image")] = False
    partial_images: Annotated[
        int,
        honoured(
            "previews per image from intermediate denoising steps; more than 0 needs stream", ge=0, le=MAX_PARTIAL_IMAGES
        ),
    ] = 0
    quality: Annotated[Refused, default_only("this server decides it", "auto", "standard")] = None
    style: Annotated[Refused, rejected("the image decoder has no styles")] = None
    background: Annotated[Refused, default_only("the images are opaque", "auto", "opaque")] = None
    moderation: Annotated[Refused, default_only("no moderation model runs", "auto")] = None
    user: Annotated[str | None, informational("an end-user id for abuse monitoring; it changes no output", STRING)] = None
    seed: Annotated[Seed | None, honoured("image i is drawn with seed + i")] = None
    # None: the server's --diffusion-steps
    num_inference_steps: Annotated[Steps | None, honoured("denoising steps; default: the server's")] = None
    # None: the checkpoint's default
    guidance_scale: Annotated[Guidance | None, honoured("classifier-free guidance; default: the checkpoint's")] = None
    step_cache_threshold: Annotated[
        StepCacheThreshold | None, honoured("the decoder's step cache; default: the server's --image-step-cache")
    ] = None
    priority: Priority = 0

    @property
    def size(self) -> tuple[int, int] | None:
        """None ("auto"): the size the model's ratio token gives; checked by parse_image_generation_request."""
        return None if self.size_sent is None else parse_size(self.size_sent)


IMAGE_FIELDS = known_fields(ImageGenerationRequest)


def parse_image_generation_request(body: Body) -> ImageGenerationRequest:
    check_known(body, IMAGE_FIELDS, IMAGES_PATH)
    req = convert(body, ImageGenerationRequest)
    if not req.prompt.strip():
        raise value_error("prompt", "must not be empty.")
    check_file_options(req.size_sent, req.output_format, req.output_compression)
    if req.partial_images and not req.stream:
        raise bad_request("'partial_images' needs 'stream' to be true.", param="partial_images")
    if req.seed is not None and req.seed > MAX_SEED:
        raise value_error("seed", f"must be between {MIN_SEED} and {MAX_SEED}, got {req.seed}.")
    return req


class ChatImageOptions(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A chat request's `image` object (an extension, shaped like `audio`): how the images the
    model draws are drawn and handed back. Every field is optional."""

    size_sent: Size | None = field(name="size", default=None)
    response_format: ResponseFormat = "url"
    output_format: OutputFormat = "png"
    output_compression: Compression | None = None
    num_inference_steps: Steps | None = None
    guidance_scale: Guidance | None = None
    step_cache_threshold: StepCacheThreshold | None = None

    @property
    def size(self) -> tuple[int, int] | None:
        """None ("auto"): the size the model's ratio token gives; checked by check_image_options."""
        return None if self.size_sent is None else parse_size(self.size_sent)


def check_image_options(options: ChatImageOptions | None) -> None:
    if options is None:
        return
    check_file_options(options.size_sent, options.output_format, options.output_compression, "image.")


def parse_chat_image_options(body: Body) -> ChatImageOptions | None:
    """A chat body's `image` object alone, as the chat parser reads it."""
    raw = body.get("image")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise type_error("image", "an object", raw)
    options = convert({"image": raw}, _ImageOnly, within=("image",)).image
    check_image_options(options)
    return options


class _ImageOnly(Struct, frozen=True):
    image: ChatImageOptions


def check_file_options(size: str | None, output_format: str, output_compression: int | None, prefix: str = "") -> None:
    """The size and file options every drawing request shares (this API's, an edit's, a chat
    request's `image`, the Responses API's image_generation tool), named under prefix."""
    check_size(size, prefix + "size")
    if output_compression is not None and output_format == "png":
        raise value_error(prefix + "output_compression", "applies to jpeg and webp output only.")


def check_size(value: str | None, param: str) -> None:
    if value is None:
        return
    try:
        parse_size(value)
    except ValueError as e:
        raise value_error(param, str(e)) from None
