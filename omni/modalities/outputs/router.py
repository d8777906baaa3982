"""OutputRouter: where a choice's generated tokens are split into output spans and each span is
sent to the consumer that turns it into what the client gets. It sits between one choice's
Generation (submit, detokenize, stop strings) and the assembly of the response (JSON or SSE):

    Generation.deltas() --> OutputRouter.deltas() --> omni/http (JSON body or SSE chunks)

Text passes through. An image span (omni/text/constrained/image_span.py: from
<|discrete_image_start|> to <|discrete_image_end|>, its codes held to the span grammar) is
withheld from the text; at its last token the codes go to the image decoder, and the decoded
image rides on that Delta (`Delta.images`). A span that the request's end cuts short (max_tokens)
gives no image.

An audio span (omni/text/constrained/audio_span.py: <|discrete_audio_start|>, 3 to 2,000 unit tokens,
<|discrete_audio_end|>) is withheld from the text too, and its units go to the vocoder in chunks
as they are sampled: a small first chunk (AudioRoute.first_chunk_units) so sound starts early,
then chunks twice the size of the last, up to chunk_units, the rest at the span's end. Each
decoded chunk rides on the Delta whose token completed it (`Delta.audio`). A span the request's
end cuts short still gives the audio of the units it has, when there are at least 3
(max_tokens: finish_reason "length").

The contract assembly relies on, which every span kind keeps: one Delta out per Delta in, in
order; a Delta's token_ids, logprobs and finish_reason unchanged (usage counts every generated
token, whatever span it was in); the last Delta carries finish_reason; `usage` is the
Generation's, complete once iteration ends; and leaving deltas() early closes the Generation
at once, which aborts its request in the engine (its KV blocks are freed before the next step).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

from omni.text.constrained.audio_span import AudioSpanFormat
from omni.text.constrained.image_span import ImageSpanFormat
from omni.engines.generation import AudioPiece, Delta, GeneratedImage, Generation, Usage
from omni.text.tokenizer import TextTokenizer

log = logging.getLogger("omni.modalities.outputs.router")


@dataclass(frozen=True, slots=True)
class ImageSpan:
    """One image as the model wrote it: its aspect ratio and its codes, row-major."""

    ratio: tuple[int, int]  # (W, H) of the span's ratio token
    rows: int
    cols: int
    codes: tuple[int, ...]


class ImageDecoder(Protocol):
    async def decode(self, span: ImageSpan, request_id: str) -> GeneratedImage: ...


class AudioSink(Protocol):
    """One audio span's way to the vocoder (omni/engines/audio_decoder.py AudioStream)."""

    async def decode(self, units: list[int], *, last: bool = False) -> bytes: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class AudioRoute:
    """What a choice needs to route audio spans: the span format, a way to open a vocoder
    stream per span (the request's voice bound in), and the chunking.

    opened: the prompt ends with the span's opening token (the speech API forces the span)."""

    format: AudioSpanFormat
    open_stream: Callable[[], AudioSink]
    sample_rate: int
    first_chunk_units: int = 4
    chunk_units: int = 25
    opened: bool = False
    # Audio asked for (chat modalities with "audio"): a choice whose text ends ("stop") without
    # an audio span goes on to speak it; this makes that continuation, the audio span opened
    # after the text, or None when no room is left for it.
    speak_after: Callable[[Generation], Generation | None] | None = None


@dataclass(slots=True)
class _OpenAudio:
    sink: AudioSink
    pending: list[int] = field(default_factory=list)  # units sampled, not yet sent
    sent: int = 0  # units already decoded
    last_chunk: int = 0  # units of the chunk sent last


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

    def __init__(self, generation: Generation, images: ImageRoute | None = None, audio: AudioRoute | None = None) -> None:
        self.generation = generation
        self._images = images
        # the open image span's tokens after its start (open from the first token when the
        # prompt opened it)
        self._span: list[int] | None = [] if images is not None and images.opened else None
        self._audio = audio
        self._voice: _OpenAudio | None = None  # the open audio span
        self._audio_spans = 0  # audio spans opened so far
        if audio is not None and audio.opened:
            self._open_audio()
        self._spoken: Generation | None = None  # the continuation that speaks the text

    @property
    def generations(self) -> list[Generation]:
        """The choice's requests: its own, and the one that speaks its text, if it ran."""
        return [self.generation] if self._spoken is None else [self.generation, self._spoken]

    @property
    def usage(self) -> Usage:
        if self._spoken is None:
            return self.generation.usage
        first, spoken = self.generation.usage, self._spoken.usage
        return Usage(first.prompt_tokens, first.completion_tokens + spoken.completion_tokens, first.cached_tokens)

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        # aclosing: closing this generator closes the Generation's now, not when it is
        # garbage collected, so an abandoned choice is aborted before the engine's next step.
        try:
            async with aclosing(self.generation.deltas()) as deltas:
                async for delta in deltas:
                    routed = await self.route(delta)
                    if routed.finish_reason == "stop" and self._must_speak():
                        self._spoken = self._speak_after()
                        if self._spoken is not None:
                            routed.finish_reason = None  # the choice goes on: its audio
                    yield routed
            if self._spoken is not None:
                self._open_audio()
                async with aclosing(self._spoken.deltas()) as deltas:
                    async for delta in deltas:
                        yield await self.route(delta)
        finally:
            if self._voice is not None:  # left mid-span: the vocoder frees the stream's state
                self._voice.sink.close()
                self._voice = None

    async def route(self, delta: Delta) -> Delta:
        """The Delta the client gets for one Delta of the Generation."""
        if self._images is None and self._audio is None:
            return delta
        for token_id in delta.token_ids:
            if self._voice is not None:
                await self._route_audio(delta, token_id)
            elif self._span is not None:
                await self._route_image(delta, token_id)
            elif self._images is not None and token_id == self._images.format.start_token_id:
                self._span = []
                self._withhold(delta, token_id)
            elif self._audio is not None and token_id == self._audio.format.start_token_id:
                self._open_audio()
                self._withhold(delta, token_id)
        if delta.finish_reason is not None and self._voice is not None:
            await self._end_audio(delta, cut=True)
        return delta

    async def _route_image(self, delta: Delta, token_id: int) -> None:
        assert self._images is not None and self._span is not None
        self._span.append(token_id)
        self._withhold(delta, token_id)
        if len(self._span) == self._images.format.span_tokens:
            span, self._span = self._read(self._span), None
            if span is not None:
                image = await self._images.decoder.decode(span, str(self.generation.request.request_id))
                delta.images.append(image)
                if self._images.inline:
                    delta.text += image.url

    def _must_speak(self) -> bool:
        return self._audio is not None and self._audio.speak_after is not None and self._audio_spans == 0

    def _speak_after(self) -> Generation | None:
        assert self._audio is not None and self._audio.speak_after is not None
        return self._audio.speak_after(self.generation)

    def _open_audio(self) -> None:
        assert self._audio is not None
        self._voice = _OpenAudio(self._audio.open_stream())

    async def _route_audio(self, delta: Delta, token_id: int) -> None:
        """A token inside an audio span: a unit (sent once a chunk is full) or the span's end."""
        route, voice = self._audio, self._voice
        assert route is not None and voice is not None
        self._withhold(delta, token_id)
        if token_id == route.format.end_token_id:
            await self._end_audio(delta, cut=False)
            return
        unit = route.format.unit_of(token_id)
        if unit is None:  # the span grammar lets only units and the end through
            log.error("%s: token %d inside an audio span is no unit", self.generation.request.request_id, token_id)
            return
        voice.pending.append(unit)
        # The first chunk waits for the span's least units, so a span cut short before it has
        # them (no audio) never sent any. Then each chunk is twice the last, up to chunk_units
        # (4, 8, 16, 25, 25, ...): a player that starts at the first chunk has the next one
        # before the first has played out.
        if voice.sent == 0:
            size = max(route.first_chunk_units, route.format.min_units)
        else:
            size = min(route.chunk_units, 2 * voice.last_chunk)
        if len(voice.pending) >= size:
            units, voice.pending = voice.pending, []
            await self._send_audio(delta, units, last=False)

    async def _end_audio(self, delta: Delta, *, cut: bool) -> None:
        """The span ended (its end token, or the request's end cutting it short): its last
        chunk; a cut span of fewer than 3 units gives no audio."""
        route, voice = self._audio, self._voice
        assert route is not None and voice is not None
        if cut and voice.sent + len(voice.pending) < route.format.min_units:
            voice.sink.close()
        else:
            await self._send_audio(delta, voice.pending, last=True)
        self._voice = None
        self._audio_spans += 1

    async def _send_audio(self, delta: Delta, units: list[int], *, last: bool) -> None:
        assert self._audio is not None and self._voice is not None
        samples = await self._voice.sink.decode(units, last=last)
        self._voice.sent += len(units)
        self._voice.last_chunk = len(units)
        delta.audio.append(AudioPiece(samples, self._audio.sample_rate, self._audio_spans, last))

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
