"""OutputRouter: where a choice's generated tokens are split into output spans and each span is
sent to the consumer that turns it into what the client gets. It sits between one choice's
Generation (submit, detokenize, stop strings) and the assembly of the response (JSON or SSE):

    Generation.deltas() --> OutputRouter.deltas() --> omni/api (JSON body or SSE chunks)

Text passes through. An image span (omni/constrained/image_span.py: from
<|discrete_image_start|> to <|discrete_image_end|>, its codes held to the span grammar) is
withheld from the text; at its last token the codes go to the image decoder, and the decoded
image rides on that Delta (`Delta.images`). A span that the request's end cuts short (max_tokens)
gives no image. Audio will plug in the same way: <|audioNNNN|> units sent to the vocoder in
chunks as they arrive, each decoded chunk riding on the Delta that completed it.

The contract assembly relies on, which every span kind keeps: one Delta out per Delta in, in
order; a Delta's token_ids, logprobs and finish_reason unchanged (usage counts every generated
token, whatever span it was in); the last Delta carries finish_reason; `usage` is the
Generation's, complete once iteration ends; and leaving deltas() early closes the Generation
at once, which aborts its request in the engine (its KV blocks are freed before the next step).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Protocol

from omni.constrained.image_span import ImageSpanFormat
from omni.generation import Delta, GeneratedImage, Generation, Usage
from omni.tokenizer import TextTokenizer

log = logging.getLogger("omni.output_router")


@dataclass(frozen=True, slots=True)
class ImageSpan:
    """One image as the model wrote it: its aspect ratio and its codes, row-major."""

    ratio: tuple[int, int]  # (W, H) of the span's ratio token
    rows: int
    cols: int
    codes: tuple[int, ...]


class ImageDecoder(Protocol):
    async def decode(self, span: ImageSpan, request_id: str) -> GeneratedImage: ...


@dataclass(frozen=True, slots=True)
class ImageRoute:
    """What a choice needs to route image spans: the span format and the decoder.

    opened: the prompt ends with the span's opening token (the images API forces the span),
    so the output starts inside it. inline: the image's URL is written into the text where
    its span was, for a dialect that writes images as a tool call's argument (the
    reference's t2i_model_generation); the image still rides on its Delta."""

    format: ImageSpanFormat
    decoder: ImageDecoder
    opened: bool = False
    inline: bool = False


class OutputRouter:
    """Routes the output spans of one choice (one Generation)."""

    def __init__(self, generation: Generation, images: ImageRoute | None = None) -> None:
        self.generation = generation
        self._images = images
        # the open image span's tokens after its start (open from the first token when the
        # prompt opened it)
        self._span: list[int] | None = [] if images is not None and images.opened else None

    @property
    def usage(self) -> Usage:
        return self.generation.usage

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        # aclosing: closing this generator closes the Generation's now, not when it is
        # garbage collected, so an abandoned choice is aborted before the engine's next step.
        async with aclosing(self.generation.deltas()) as deltas:
            async for delta in deltas:
                yield await self.route(delta)

    async def route(self, delta: Delta) -> Delta:
        """The Delta the client gets for one Delta of the Generation."""
        if self._images is None:
            return delta
        fmt = self._images.format
        for token_id in delta.token_ids:
            if self._span is None:
                if token_id == fmt.start_token_id:
                    self._span = []
                    self._withhold(delta, token_id)
                continue
            self._span.append(token_id)
            self._withhold(delta, token_id)
            if len(self._span) == fmt.span_tokens:
                span, self._span = self._read(self._span), None
                if span is not None:
                    image = await self._images.decoder.decode(span, str(self.generation.request.request_id))
                    delta.images.append(image)
                    if self._images.inline:
                        delta.text += image.url
        return delta

    def _withhold(self, delta: Delta, token_id: int) -> None:
        """A span token's own text (present when special tokens are written out) is not text."""
        written = self._tokenizer.decode([token_id], skip_special_tokens=False)
        if not self.generation.skip_special_tokens and delta.text.endswith(written):
            delta.text = delta.text[: len(delta.text) - len(written)]

    @property
    def _tokenizer(self) -> TextTokenizer:
        return self.generation.model.tokenizer

    def _read(self, tokens: list[int]) -> ImageSpan | None:
        """The span's ratio and codes; None (and a log line) for a span the grammar would not
        have let through."""
        assert self._images is not None
        fmt = self._images.format
        ratio = ImageSpanFormat.ratio(self._tokenizer.decode([tokens[0]], skip_special_tokens=False))
        codes: list[int] = []
        for r in range(fmt.rows):
            row = tokens[2 + r * (fmt.cols + 1) : 2 + (r + 1) * (fmt.cols + 1) - 1]
            codes.extend(c for c in (fmt.code_of(t) for t in row) if c is not None)
        if ratio is None or len(codes) != fmt.rows * fmt.cols:
            log.error("%s: an image span that is not well formed was dropped", self.generation.request.request_id)
            return None
        return ImageSpan(ratio, fmt.rows, fmt.cols, tuple(codes))
