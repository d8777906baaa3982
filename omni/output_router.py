"""OutputRouter: where a choice's generated tokens are split into output spans and each span is
sent to the consumer that turns it into what the client gets. It sits between one choice's
Generation (submit, detokenize, stop strings) and the assembly of the response (JSON or SSE):

    Generation.deltas() --> OutputRouter.deltas() --> omni/api (JSON body or SSE chunks)

Every span goes to text today: the model's output is only ever text to the client, so each
Delta passes through unchanged. The decoders will plug in here, in route(), and nowhere else:

- image output: the tokens between <|image_start|> and <|image_end|> are image codes
  (<|visionNNNNN|>, 729 per image in the reference model). route() will withhold them from
  the text and, at <|image_end|>, hand the codes to the vision decoder (one request to its
  process group), yielding the decoded image (a content part or a URL) on that Delta.
- audio output: route() will send <|audioNNNN|> unit tokens to the audio vocoder in chunks
  (a fixed number of units each) as they arrive, so audio streams while the text goes on;
  each decoded chunk rides on the Delta that completed it, the remainder on the last Delta.

The contract assembly relies on, which those decoders keep: one Delta out per Delta in, in
order; a Delta's token_ids, logprobs and finish_reason unchanged (usage counts every generated
token, whatever span it was in); the last Delta carries finish_reason; `usage` is the
Generation's, complete once iteration ends; and leaving deltas() early closes the Generation
at once, which aborts its request in the engine (its KV blocks are freed before the next step).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

from omni.generation import Delta, Generation, Usage


class OutputRouter:
    """Routes the output spans of one choice (one Generation)."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation

    @property
    def usage(self) -> Usage:
        return self.generation.usage

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        # aclosing: closing this generator closes the Generation's now, not when it is
        # garbage collected, so an abandoned choice is aborted before the engine's next step.
        async with aclosing(self.generation.deltas()) as deltas:
            async for delta in deltas:
                yield self.route(delta)

    def route(self, delta: Delta) -> Delta:
        """The Delta the client gets for one Delta of the Generation. Text only so far: every
        span is text, which the Generation has already detokenized and stop-checked."""
        return delta
