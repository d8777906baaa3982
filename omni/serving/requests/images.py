"""The body of POST /v1/images/generations, as the official openai client sends it.

OpenAI's fields: prompt, model, n, size, response_format (url | b64_json), output_format (png |
jpeg | webp), output_compression, stream and partial_images (0 to 3), and quality, style,
background and moderation, which this decoder has no knob for: each is accepted only at its
default ("auto"; style has none, so it is refused). The extensions vLLM-style servers take:
seed, num_inference_steps and guidance_scale. A field of neither is a 400 naming it, as on the
other endpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct, field

from omni.errors import bad_request
from omni.serving.requests.fields import (
    MAX_SEED,
    MIN_SEED,
    Body,
    check_known_fields,
    opt_bool,
    opt_int,
    opt_number,
    opt_str,
    required_str,
    type_error,
    unsupported,
    validation_error,
    value_error,
    without_nulls,
)
from omni.shared.media.image_sizes import parse_size

MAX_IMAGES = 10  # OpenAI's bound on n
MAX_PROMPT_CHARS = 32_000  # OpenAI's, for its newest image model
MAX_STEPS = 100
MAX_GUIDANCE = 20.0
MAX_PARTIAL_IMAGES = 3
RESPONSE_FORMATS = ("url", "b64_json")
OUTPUT_FORMATS = ("png", "jpeg", "webp")
# Fields with no effect here, accepted at the value that means "the server decides".
_DEFAULT_ONLY: Mapping[str, tuple[str, ...]] = {
    "quality": ("auto", "standard"),
    "background": ("auto", "opaque"),
    "moderation": ("auto",),
}
_KNOWN = frozenset(
    {
        "prompt", "model", "n", "size", "response_format", "output_format", "output_compression",
        "stream", "partial_images", "quality", "style", "background", "moderation", "user",
        "seed", "num_inference_steps", "guidance_scale",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageGenerationRequest:
    model: str | None  # None: the server's only image-capable model
    prompt: str
    n: int = 1
    size: tuple[int, int] | None = None  # None ("auto"): the size the model's ratio token gives
    response_format: str = "url"
    output_format: str = "png"
    output_compression: int | None = None  # jpeg / webp quality, 0 to 100
    stream: bool = False
    partial_images: int = 0
    seed: int | None = None
    num_inference_steps: int | None = None  # None: the server's --diffusion-steps
    guidance_scale: float | None = None  # None: the checkpoint's default


def parse_image_generation_request(body: Body) -> ImageGenerationRequest:
    check_known_fields(body, _KNOWN, "/v1/images/generations")
    prompt = required_str(body, "prompt")
    if not prompt.strip():
        raise value_error("prompt", "must not be empty.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise value_error("prompt", f"must be at most {MAX_PROMPT_CHARS} characters, got {len(prompt)}.")
    for name, allowed in _DEFAULT_ONLY.items():
        value = opt_str(body, name)
        if value is not None and value not in allowed:
            raise unsupported(name, f"this server decides it; send {allowed[0]!r} or leave it out.")
    if body.get("style") is not None:
        raise unsupported("style", "the image decoder has no styles.")
    opt_str(body, "user")  # an identifier, recorded nowhere yet: checked for type only
    size = _size(body)
    response_format = _choice(body, "response_format", RESPONSE_FORMATS)
    output_format = _choice(body, "output_format", OUTPUT_FORMATS) or "png"
    compression = opt_int(body, "output_compression", lo=0, hi=100)
    if compression is not None and output_format == "png":
        raise value_error("output_compression", "applies to jpeg and webp output only.")
    stream = bool(opt_bool(body, "stream"))
    partial = opt_int(body, "partial_images", lo=0, hi=MAX_PARTIAL_IMAGES)
    if partial and not stream:
        raise bad_request("'partial_images' needs 'stream' to be true.", param="partial_images")
    guidance = _guidance(body, "guidance_scale")
    n = opt_int(body, "n", lo=1, hi=MAX_IMAGES)
    return ImageGenerationRequest(
        model=opt_str(body, "model"),
        prompt=prompt,
        n=1 if n is None else n,
        size=size,
        response_format=response_format or "url",
        output_format=output_format,
        output_compression=compression,
        stream=stream,
        partial_images=partial or 0,
        seed=opt_int(body, "seed", lo=MIN_SEED, hi=MAX_SEED),
        num_inference_steps=opt_int(body, "num_inference_steps", lo=1, hi=MAX_STEPS),
        guidance_scale=guidance,
    )


class ChatImageOptions(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A chat request's `image` object (an extension, shaped like `audio`): how the images the
    model draws are drawn and handed back. Every field is optional."""

    size_sent: Annotated[
        str | None, Meta(description="auto: the size of the aspect ratio the model picks.")
    ] = field(name="size", default=None)
    response_format: Annotated[
        Literal["url", "b64_json"], Meta(description="url: a signed URL; b64_json: the bytes.")
    ] = "url"
    output_format: Literal["png", "jpeg", "webp"] = "png"
    output_compression: Annotated[int, Meta(ge=0, le=100, description="The jpeg or webp quality.")] | None = None
    num_inference_steps: Annotated[
        int, Meta(ge=1, le=MAX_STEPS, description="Denoising steps; default: the server's.")
    ] | None = None
    guidance_scale: Annotated[float, Meta(ge=0.0, le=MAX_GUIDANCE, description="Default: the checkpoint's.")] | None = None

    @property
    def size(self) -> tuple[int, int] | None:
        """None ("auto"): the size the model's ratio token gives; checked by check_image_options."""
        return None if self.size_sent is None else parse_size(self.size_sent)


def check_image_options(options: ChatImageOptions | None) -> None:
    if options is None:
        return
    _size({"size": options.size_sent}, "image.size")
    if options.output_compression is not None and options.output_format == "png":
        raise value_error("image.output_compression", "applies to jpeg and webp output only.")


def parse_chat_image_options(body: Body) -> ChatImageOptions | None:
    """A chat body's `image` object alone, as the chat parser reads it."""
    raw = body.get("image")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise type_error("image", "an object", raw)
    try:
        options = msgspec.convert({"image": without_nulls(raw)}, _ImageOnly, strict=True).image
    except msgspec.ValidationError as e:
        raise validation_error(e) from None
    check_image_options(options)
    return options


class _ImageOnly(Struct, frozen=True):
    image: ChatImageOptions


def _guidance(body: Body, param: str) -> float | None:
    guidance = opt_number(body, "guidance_scale", param)
    if guidance is not None and not 0.0 <= guidance <= MAX_GUIDANCE:
        raise value_error(param, f"must be between 0 and {MAX_GUIDANCE:g}, got {guidance:g}.")
    return guidance


def _size(body: Body, param: str = "size") -> tuple[int, int] | None:
    value = opt_str(body, "size", param)
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        raise value_error(param, str(e)) from None


def _choice(body: Body, key: str, allowed: tuple[str, ...], param: str | None = None) -> str | None:
    value = opt_str(body, key, param)
    if value is not None and value not in allowed:
        raise value_error(param or key, f"'{value}'; expected one of {', '.join(allowed)}.")
    return value
