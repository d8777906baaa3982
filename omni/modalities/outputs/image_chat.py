"""The image's chat side (omni/modalities/outputs/chat_output.py): whether and how the images a
chat turn's model draws come out, and where they go in the body.

An image comes unasked (IMAGE.unasked): a request that gives no modalities, or names "image",
lets the model draw; its `image` object says how (size, steps, guidance, format, URL or bytes).
Choice i's first image has seed + i * SEEDS_PER_CHOICE, its next ones count up. In the body a
turn's images follow its text as content parts (the shape a user message's content takes); in
a stream, each Delta's images are a chunk of their own whose delta.content is those parts. The
reference's dialect writes an image as its t2i_model_generation call's argument: then its URL is
written into the text instead (inline), and no part is added.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from msgspec import Meta, Struct

from omni.engines.generation import Delta
from omni.errors import bad_request
from omni.modalities.outputs.chat_output import ChatModel
from omni.modalities.outputs.image import IMAGE, GeneratedImage, ImageRoute, ImageSettings, ModelImages, queue_preview
from omni.modalities.outputs.kind import Carrier, OutputSpans
from omni.text.parsers.tool_calls import ToolFunction
from omni.text.parsers.tool_grammar import T2I_TOOL
from scheduler.request import SamplingParams

SEEDS_PER_CHOICE = 1 << 16  # more images than one turn holds


class OutputImageURL(Struct):
    url: Annotated[str, Meta(description="The image's signed URL; a data: URL with image.response_format b64_json.")]


class OutputImagePart(Struct, tag_field="type", tag="image_url"):
    image_url: OutputImageURL


class ImageDecoderDetails(Struct):
    """Ours: the image decoder's DiT block computations for all the images drawn, every
    denoising step and guidance pass; skipped: those its step cache reused (step_cache_threshold)."""

    blocks_computed: Annotated[int, Meta(ge=0)]
    blocks_skipped: Annotated[int, Meta(ge=0)]


def decoder_details(drawn: Sequence[GeneratedImage]) -> ImageDecoderDetails:
    return ImageDecoderDetails(sum(i.blocks_computed for i in drawn), sum(i.blocks_skipped for i in drawn))


class ImageOptions(Protocol):
    """A chat request's `image` object (omni/serving/requests/images.py ChatImageOptions)."""

    @property
    def size(self) -> tuple[int, int] | None: ...
    @property
    def num_inference_steps(self) -> int | None: ...
    @property
    def guidance_scale(self) -> float | None: ...
    @property
    def step_cache_threshold(self) -> float | None: ...
    @property
    def output_format(self) -> str: ...
    @property
    def output_compression(self) -> int | None: ...
    @property
    def response_format(self) -> str: ...


class Tools(Protocol):
    @property
    def choice(self) -> str: ...
    @property
    def functions(self) -> Sequence[ToolFunction]: ...


class ImageRequest(Protocol):
    """What the image's chat side reads of a chat request (omni/serving/requests/chat.py)."""

    @property
    def modalities(self) -> tuple[str, ...]: ...
    @property
    def images_allowed(self) -> bool: ...
    @property
    def image(self) -> ImageOptions | None: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def tools(self) -> Tools: ...


@dataclass(frozen=True, slots=True)
class ChatImages:
    """How a chat request's choices draw the images their model opens spans for."""

    images: ModelImages
    settings: ImageSettings
    inline: bool  # the reference dialect: the image is a t2i_model_generation call's argument
    previews: asyncio.Queue[Any] | None = None  # where each drawn image's previews go (ImagePreview)

    def spans(self) -> OutputSpans | None:
        grammar = self.images.grammar
        return None if grammar is None else OutputSpans(grammar, self.images.format.start_token_id)

    def answer_format(self) -> ChatImages | None:
        """Under an answer format (response_format, structured outputs) the content is the
        format's text alone: nothing is drawn."""
        return None

    def within(self, params: SamplingParams) -> tuple[ChatImages, SamplingParams]:
        """An image span takes what its turn's max_tokens leaves; it is drawn at the turn's priority."""
        return dataclasses.replace(self, settings=dataclasses.replace(self.settings, priority=params.priority)), params

    def with_previews(self, partial_images: int, previews: asyncio.Queue[Any]) -> ChatImages:
        """Each drawn image's partial_images previews go on the queue, under its choice's index."""
        settings = dataclasses.replace(self.settings, partial_images=partial_images)
        return dataclasses.replace(self, settings=settings, previews=previews)

    def call_rules(self) -> Sequence[str]:
        """The reference's t2i_model_generation takes a whole image span as its argument."""
        return self.images.format.rules("image")

    def route(self, model: ChatModel, choice_index: int) -> ImageRoute:
        seed = self.settings.seed
        first = None if seed is None else seed + choice_index * SEEDS_PER_CHOICE
        on_preview = None if self.previews is None else functools.partial(queue_preview, self.previews, choice_index)
        return self.images.route(self.settings, first_seed=first, inline=self.inline, on_preview=on_preview)

    def body(self, choices: int) -> DrawnBody:
        return DrawnBody(self.inline)


@dataclass(slots=True)
class DrawnBody:
    """Drawn images in a chat body: content parts after the text (none when inline: the URL is
    in the text), and the decoder's work for them all in the usage."""

    inline: bool
    drawn: list[GeneratedImage] = field(default_factory=list)  # every choice's, as count() saw them

    def spoke(self, index: int, carrier: Carrier) -> bool:
        return False

    def parts(self, carrier: Carrier) -> list[Any]:
        if self.inline:
            return []
        return [OutputImagePart(OutputImageURL(image.url)) for image in IMAGE.pieces(carrier)]

    async def message(self, carrier: Carrier, text: str) -> dict[str, Any]:
        return {}

    def delta(self, index: int, delta: Delta, content: str) -> dict[str, Any]:
        return {}

    async def finish(self) -> None:
        return None

    def count(self, carrier: Carrier) -> None:
        self.drawn.extend(IMAGE.pieces(carrier))

    def usage(self) -> dict[str, Any]:
        """usage.decoder_details, once any image was drawn (a turn of text alone has none)."""
        return {"decoder_details": decoder_details(self.drawn)} if self.drawn else {}


def chat_images(model: ChatModel, req: ImageRequest) -> ChatImages | None:
    """None when no image can come out: the model has no vision decoder (then asking for images
    is a 400), or modalities leaves image out."""
    images = model.output(IMAGE)
    if images is None:  # (`image` alone is accepted: it says how images are drawn, if any are)
        if "image" in req.modalities:
            raise bad_request("This model has no image decoder: it cannot produce images.", param="modalities")
        return None
    if not req.images_allowed:
        return None
    opts = req.image
    settings = ImageSettings(seed=req.seed)  # no `image` object: every field's default
    if opts is not None:
        settings = ImageSettings(
            size=opts.size,
            steps=opts.num_inference_steps,
            guidance_scale=opts.guidance_scale,
            step_cache=opts.step_cache_threshold,
            seed=req.seed,
            output_format=opts.output_format,
            quality=opts.output_compression,
            as_url=opts.response_format == "url",
        )
    tools = req.tools
    inline = (
        model.chat_format.tool_parser == "hyperclovax"
        and tools.choice != "none"
        and any(f.name == T2I_TOOL for f in tools.functions)
    )
    return ChatImages(images, settings, inline)
