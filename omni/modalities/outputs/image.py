"""A model's image output: its decoder, the grammar of its image spans, and how one request's
images are drawn, stored and handed out.

    ModelImages        one per served model with a vision_decoder/: the engine, the span format
                       (its code grid read from the decoder's config.json), the span grammar
    ImageSettings      one request's choices: size, steps, guidance, seed, format, URL or bytes
    ImageRoute         one choice's image spans for the output router: withheld tokens -> codes
    ImageDrawer        the route's ImageDecoder for one choice: span -> GeneratedImage
    IMAGE              the kind (omni/modalities/outputs/kind.py): GeneratedImage pieces

An image's size is the request's, else the one the size table gives the span's ratio token (a
ratio the table lacks is drawn at the table's nearest aspect). Its seed is the request's seed
plus the index of the image in the request (choices, then spans in order), else random: the
same request with the same seed gives the same bytes. Images handed out by URL are written to
the artifact store under out/image/ and get its signed (local) or presigned (S3) URL; images
asked for as bytes (b64_json, data URLs) are not stored.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from omni.config import ModelConfig
from omni.engines.generation import Delta, Generation
from omni.engines.supervisor import SupervisedWorker
from omni.engines.vision_decoder import ImageRequest
from omni.engines.vision_replicas import VisionDecoderReplicas
from omni.engines.worker_specs import vision_decoder_worker_specs
from omni.errors import APIError
from omni.metrics import Metrics
from omni.modalities.outputs.kind import OutputKind
from omni.shared.media.compositing import EditCanvas
from omni.shared.media.image_sizes import nearest_size
from omni.shared.store.base import ArtifactStore
from omni.shared.store.keys import output_key
from omni.text.constrained.compiler import CompiledGrammar, GrammarCompiler
from omni.text.constrained.image_span import START, ImageSpanFormat
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.tokenizer import TextTokenizer

# (preview index, its bytes, size="WxH"): an image's previews as they are made
SizedPreviewCallback = Callable[..., None]


@dataclass(frozen=True, slots=True)
class ImagePreview:
    """A preview of an image being drawn, as a request's queue of them holds it."""

    image: int  # which of the request's images (the images API's n, chat's choice)
    index: int  # its previews count from 0
    data: bytes
    size: str  # "WxH"


def queue_preview(queue: asyncio.Queue[Any], image: int, index: int, data: bytes, *, size: str) -> None:
    """A SizedPreviewCallback, with the queue and the image bound in."""
    queue.put_nowait(ImagePreview(image, index, data, size))


log = logging.getLogger("omni.modalities.outputs.image")

DEFAULT_STEPS = 25
URL_EXPIRES_S = 3600  # an hour, as OpenAI's image URLs
MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
_EXTENSIONS = {"png": "png", "jpeg": "jpg", "webp": "webp"}


def read_code_grid(decoder_dir: Path) -> tuple[int, int]:
    """(rows, cols) of the codes one image span holds (27 x 27 in the reference): from
    vision_decoder/config.json's code_grid, or in the published decoder/vision/ folder from
    token_embedder/config.json's token_length, a square."""
    decoder_dir = Path(decoder_dir)
    published = (decoder_dir / "model_index.json").is_file()
    source = decoder_dir / ("token_embedder/config.json" if published else "config.json")
    try:
        config = json.loads(source.read_text())
        if published:
            length = int(config.get("token_length", 729))
            side = math.isqrt(length)
            if side * side != length:
                raise ValueError(f"token_length {length} is not a square")
            rows, cols = side, side
        else:
            rows, cols = (int(v) for v in config.get("code_grid", (27, 27)))
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"{source}: no usable code grid ({e})") from None
    if rows <= 0 or cols <= 0:
        raise ValueError(f"{source}: code grid {rows}x{cols} is not positive")
    return rows, cols


@dataclass(frozen=True, slots=True)
class GeneratedImage:
    """A decoded image as assembly hands it out: where it can be fetched (a signed URL, or a
    data URL), and what it is."""

    url: str
    width: int
    height: int
    media_type: str = "image/png"
    data: bytes = b""  # the encoded image (b64_json answers send it)
    key: str | None = None  # its artifact-store key, when it was stored
    seed: int | None = None
    # the decoder's DiT blocks run and skipped by its step cache for this image
    blocks_computed: int = 0
    blocks_skipped: int = 0


@dataclass(frozen=True, slots=True)
class ImageSpan:
    """One image as the model wrote it: its aspect ratio and its codes, row-major."""

    ratio: tuple[int, int]  # (W, H) of the span's ratio token
    rows: int
    cols: int
    codes: tuple[int, ...]


class ImageDecoder(Protocol):
    async def decode(self, span: ImageSpan, request_id: str) -> GeneratedImage: ...


@dataclass(slots=True)
class ImageRoute:
    """One choice's image spans (a SpanRoute, omni/modalities/outputs/router.py): the span format and
    the decoder. At the span's last token its codes go to the decoder, and the image rides on that
    Delta; a span the request's end cuts short gives no image.

    opened: the prompt ends with the span's opening token (the images API forces the span),
    so the output starts inside it. inline: the image's URL is written into the text where
    its span was, for a dialect that writes images as a tool call's argument (the
    reference's t2i_model_generation); the image still rides on its Delta."""

    format: ImageSpanFormat
    decoder: ImageDecoder
    opened: bool = False
    inline: bool = False
    _tokens: list[int] = field(default_factory=list, init=False)  # the open span's, after its start
    _generation: Generation | None = field(default=None, init=False)  # the request writing it

    def opens(self, token_id: int) -> bool:
        return token_id == self.format.start_token_id

    def open(self, generation: Generation) -> None:
        self._tokens, self._generation = [], generation

    async def feed(self, delta: Delta, token_id: int) -> bool:
        assert self._generation is not None
        self._tokens.append(token_id)
        if len(self._tokens) < self.format.span_tokens:
            return False
        span = self._read(self._tokens)
        if span is not None:
            image = await self.decoder.decode(span, str(self._generation.request.request_id))
            IMAGE.add(delta, image)
            if self.inline:
                delta.text += image.url
        return True

    async def end(self, delta: Delta, *, cut: bool) -> None:
        self._tokens = []  # cut short: no image

    def close(self) -> None:
        self._tokens = []

    def after(self, generation: Generation) -> Generation | None:
        return None

    def missing(self) -> APIError | None:
        return None  # images come when the model draws them: none is owed

    def _read(self, tokens: list[int]) -> ImageSpan | None:
        """The span's ratio and codes; None (and a log line) for a span the grammar would not
        have let through."""
        assert self._generation is not None
        fmt = self.format
        ratio = ImageSpanFormat.ratio(self._generation.tokenizer.decode([tokens[0]], skip_special_tokens=False))
        codes: list[int] = []
        for r in range(fmt.rows):
            row = tokens[2 + r * (fmt.cols + 1) : 2 + (r + 1) * (fmt.cols + 1) - 1]
            codes.extend(c for c in (fmt.code_of(t) for t in row) if c is not None)
        if ratio is None or len(codes) != fmt.rows * fmt.cols:
            log.error("%s: an image span that is not well formed was dropped", self._generation.request.request_id)
            return None
        return ImageSpan(ratio, fmt.rows, fmt.cols, tuple(codes))


@dataclass(frozen=True, slots=True)
class ImageSettings:
    size: tuple[int, int] | None = None  # None: from the span's ratio token
    steps: int | None = None  # None: the server's --diffusion-steps
    guidance_scale: float | None = None  # None: the checkpoint's default
    step_cache: float | None = None  # None: the server's --image-step-cache
    seed: int | None = None  # None: a random one per request
    output_format: str = "png"
    quality: int | None = None
    as_url: bool = True  # False: bytes (a data URL in chat, b64_json in the images API)
    partial_images: int = 0
    priority: int = 0  # the request's: the decoder draws the most urgent first
    # An edit's: the drawn image is drawn as PNG, then made the canvas's size and composited
    # into the input outside the mask (omni/shared/media/compositing.py), then encoded.
    canvas: EditCanvas | None = None


class ModelImages:
    def __init__(
        self,
        engine: VisionDecoderReplicas,
        fmt: ImageSpanFormat,
        store: ArtifactStore,
        metrics: Metrics,
        *,
        default_steps: int = DEFAULT_STEPS,
    ) -> None:
        self.engine = engine
        self.format = fmt
        self.store = store
        self.metrics = metrics
        self.default_steps = default_steps
        self.grammar: CompiledGrammar | None = None  # compiled by prepare()

    @classmethod
    def for_model(
        cls,
        engine: VisionDecoderReplicas,
        decoder_dir: Path,
        tokenizer: TextTokenizer,
        store: ArtifactStore,
        metrics: Metrics,
        *,
        default_steps: int = DEFAULT_STEPS,
    ) -> ModelImages:
        rows, cols = read_code_grid(decoder_dir)
        fmt = ImageSpanFormat.from_tokenizer(tokenizer, rows, cols)
        if fmt is None:
            raise ValueError(
                f"{decoder_dir}: the model has a vision decoder, but its vocabulary lacks the image span "
                "tokens (<|discrete_image_start|>, ratio tokens, <|visionNNNNN|> codes)"
            )
        return cls(engine, fmt, store, metrics, default_steps=default_steps)

    async def prepare(self, compiler: GrammarCompiler) -> None:
        """Compile the span grammar (once, off the event loop)."""
        self.grammar = await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, self.format.grammar(), "image"))

    @property
    def ready(self) -> bool:
        return self.engine.ready

    @property
    def workers(self) -> tuple[SupervisedWorker, ...]:
        return self.engine.workers

    def route(
        self, settings: ImageSettings, *, first_seed: int | None = None, opened: bool = False, inline: bool = False,
        on_preview: SizedPreviewCallback | None = None,
    ) -> ImageRoute:  # fmt: skip
        """One choice's route. first_seed: the seed of its first image (None: random);
        opened: the prompt already opened its span; inline: the image's URL is written into
        the text where its span was (the reference's t2i_model_generation tool call)."""
        drawer = ImageDrawer(self, settings, first_seed, on_preview)
        return ImageRoute(self.format, drawer, opened=opened, inline=inline)


@dataclass(slots=True)
class ImageDrawer:
    """An ImageRoute's decoder: draws a span's image and stores it (or makes its data URL)."""

    images: ModelImages
    settings: ImageSettings
    first_seed: int | None
    on_preview: SizedPreviewCallback | None = None
    drawn: int = field(default=0)

    async def decode(self, span: ImageSpan, request_id: str) -> GeneratedImage:
        s = self.settings
        width, height = s.size or nearest_size(*span.ratio)
        seed = (self.first_seed if self.first_seed is not None else random.getrandbits(63)) + self.drawn
        self.drawn += 1
        started = time.monotonic()
        decoded = await self.images.engine.draw(
            ImageRequest(
                codes=span.codes,
                width=width,
                height=height,
                steps=s.steps or self.images.default_steps,
                seed=seed % 2**64,
                guidance_scale=s.guidance_scale,
                step_cache=s.step_cache,
                output_format="png" if s.canvas is not None else s.output_format,
                quality=None if s.canvas is not None else s.quality,
                partial_images=s.partial_images,
                priority=s.priority,
            ),
            None if self.on_preview is None else functools.partial(self.on_preview, size=f"{width}x{height}"),
        )
        data, out_width, out_height = decoded.data, decoded.width, decoded.height
        if s.canvas is not None:  # Pillow releases the GIL as it resizes and encodes
            data, out_width, out_height = await asyncio.to_thread(s.canvas.finish, data, s.output_format, s.quality)
        media_type = MEDIA_TYPES[s.output_format]
        if s.as_url:
            key = output_key("image", _EXTENSIONS[s.output_format])
            put = time.monotonic()
            await self.images.store.put(key, data, media_type)
            self.images.metrics.observe_store("put", time.monotonic() - put)
            url = await self.images.store.url(key, URL_EXPIRES_S)
        else:
            key = None
            url = f"data:{media_type};base64,{base64.b64encode(data).decode()}"
        log.debug("%s: image %dx%d seed %d in %.2f s", request_id, width, height, seed, time.monotonic() - started)
        return GeneratedImage(
            url, out_width, out_height, media_type, data=data, key=key, seed=seed,
            blocks_computed=decoded.blocks_computed, blocks_skipped=decoded.blocks_skipped,
        )  # fmt: skip


def build(config: ModelConfig, tokenizer: TextTokenizer, store: ArtifactStore, metrics: Metrics) -> ModelImages | None:
    """A served model's ModelImages, None when it has no vision decoder."""
    if config.vision_decoder_dir is None:
        return None
    engine = VisionDecoderReplicas(
        vision_decoder_worker_specs(config),
        metrics,
        config.name,
        config.vision_decoder,
        start_timeout=config.worker.worker_start_timeout,
    )
    return ModelImages.for_model(
        engine,
        config.vision_decoder_dir,
        tokenizer,
        store,
        metrics,
        default_steps=config.vision_decoder.diffusion_steps,
    )


IMAGE: OutputKind[ModelImages, GeneratedImage] = OutputKind(
    "image", ModelImages, GeneratedImage, ImageRoute, build, START
)
