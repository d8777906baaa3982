"""OutputRouter: where a choice's generated tokens are split into output spans and each span is
sent to the consumer that turns it into what the client gets. It sits between one choice's
Generation (submit, detokenize, stop strings) and the assembly of the response (JSON or SSE):

    Generation.deltas() --> OutputRouter.deltas() --> omni/http (JSON body or SSE chunks)

Text passes through. Each kind of span is a SpanRoute, and the router only loops over the
choice's routes: a token opens the span of the first route that claims it, goes into the open
span, or is text. A span's tokens are withheld from the text; what the span makes rides on the
Delta of the token that completed it. The kinds:

    ImageRoute   omni/modalities/outputs/image.py   an image span's codes -> the image decoder (IMAGE's pieces)
    AudioRoute   omni/modalities/outputs/audio.py   an audio span's units -> the vocoder, in chunks (AUDIO's pieces)

A new output modality is a route class beside its model output, named by its OutputKind
(omni/modalities/outputs/kind.py); this loop does not change.

The contract assembly relies on, which every span kind keeps: one Delta out per Delta in, in
order; a Delta's token_ids, logprobs and finish_reason unchanged (usage counts every generated
token, whatever span it was in); the last Delta carries finish_reason; `usage` is the
Generation's, complete once iteration ends; and leaving deltas() early closes the Generation
at once, which aborts its request in the engine (its KV blocks are freed before the next step).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Protocol

from omni.engines.generation import Delta, Generation, Usage
from omni.errors import APIError


class SpanRoute(Protocol):
    """One kind of output span, as one choice routes it (ImageRoute in omni/modalities/outputs/image.py,
    AudioRoute in omni/modalities/outputs/audio.py). The router withholds every token of a span from
    the text; the route makes the span's output and puts it on the Delta.

    opened: the prompt ends with the span's opening token, so the output starts inside it."""

    opened: bool

    def opens(self, token_id: int) -> bool:
        """Whether token_id opens a span of this kind."""
        ...

    def open(self, generation: Generation) -> None:
        """A span starts (its opening token, or the prompt's); generation is the request
        writing it (its id names the span, its tokenizer reads it)."""
        ...

    async def feed(self, delta: Delta, token_id: int) -> bool:
        """A token inside the open span, on the Delta that carries it; True when it ends the span."""
        ...

    async def end(self, delta: Delta, *, cut: bool) -> None:
        """The request ended on delta inside the open span (cut: before the span's own end)."""
        ...

    def close(self) -> None:
        """The choice was left inside the open span: free what the span holds."""
        ...

    def after(self, generation: Generation) -> Generation | None:
        """A continuation of the choice once its text ends ("stop", or "length": cut at its share
        of max_tokens), opened inside a span of this kind (audio asked for: the text spoken), or
        None."""
        ...

    def missing(self) -> APIError | None:
        """Once the choice has ended: the error for an output it was asked for and did not make
        (audio asked for, no units), or None. The router raises it in place of the last Delta."""
        ...


class OutputRouter:
    """Routes the output spans of one choice (one Generation): each token either opens a span
    of one of the routes, goes into the open span, or is text. A route given as None (a kind
    the choice does not produce) is left out."""

    def __init__(self, generation: Generation, *routes: SpanRoute | None) -> None:
        self.generation = generation
        self.routes = tuple(r for r in routes if r is not None)
        self._open: SpanRoute | None = None  # the route whose span the output is inside
        for route in self.routes:
            if route.opened:
                self._start(route, generation)
        self._after: Generation | None = None  # the continuation after the text, if it ran
        self._after_route: SpanRoute | None = None
        self._text_cut = False  # the text ran to its max_tokens before the continuation

    @property
    def generations(self) -> list[Generation]:
        """The choice's requests: its own, and the one that continues it, if it ran."""
        return [self.generation] if self._after is None else [self.generation, self._after]

    @property
    def usage(self) -> Usage:
        if self._after is None:
            return self.generation.usage
        first, after = self.generation.usage, self._after.usage
        return Usage(first.prompt_tokens, first.completion_tokens + after.completion_tokens, first.cached_tokens)

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        # aclosing: closing this generator closes the Generation's now, not when it is
        # garbage collected, so an abandoned choice is aborted before the engine's next step.
        try:
            async with aclosing(self.generation.deltas()) as deltas:
                async for delta in deltas:
                    routed = await self.route(delta)
                    if routed.finish_reason in ("stop", "length") and self._continue():
                        self._text_cut = routed.finish_reason == "length"
                        routed.finish_reason = None  # the choice goes on
                    self._check_made(routed)
                    yield routed
            if self._after is not None and self._after_route is not None:
                self._start(self._after_route, self._after)
                async with aclosing(self._after.deltas()) as deltas:
                    async for delta in deltas:
                        routed = await self.route(delta)
                        if self._text_cut and routed.finish_reason == "stop":
                            routed.finish_reason = "length"  # the answer was cut, though all it said is spoken
                        self._check_made(routed)
                        yield routed
        finally:
            if self._open is not None:  # left mid-span
                self._open.close()
                self._open = None

    async def route(self, delta: Delta) -> Delta:
        """The Delta the client gets for one Delta of the Generation."""
        if not self.routes:
            return delta
        for token_id in delta.token_ids:
            if self._open is not None:
                self._withhold(delta, token_id)
                if await self._open.feed(delta, token_id):
                    self._open = None
                continue
            for route in self.routes:
                if route.opens(token_id):
                    self._withhold(delta, token_id)
                    self._start(route, self.generation)
                    break
        if delta.finish_reason is not None and self._open is not None:
            await self._open.end(delta, cut=True)
            self._open = None
        return delta

    def _start(self, route: SpanRoute, generation: Generation) -> None:
        route.open(generation)
        self._open = route

    def _continue(self) -> bool:
        """The text ended: the first route that continues the choice makes its continuation."""
        for route in self.routes:
            after = route.after(self.generation)
            if after is not None:
                self._after, self._after_route = after, route
                return True
        return False

    def _check_made(self, delta: Delta) -> None:
        """A choice that ended ("stop", "length") without an output it was asked for is an error,
        raised in place of its last Delta: never an answer that silently lacks it."""
        if delta.finish_reason not in ("stop", "length"):
            return
        for route in self.routes:
            error = route.missing()
            if error is not None:
                raise error

    def _withhold(self, delta: Delta, token_id: int) -> None:
        """A span token's own text (present when special tokens are written out) is not text."""
        if self.generation.output.skip_special_tokens:
            return
        written = self.generation.tokenizer.decode([token_id], skip_special_tokens=False)
        if delta.text.endswith(written):
            delta.text = delta.text[: len(delta.text) - len(written)]
