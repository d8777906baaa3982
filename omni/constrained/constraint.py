"""TokenConstraint: one request's grammar matcher, its token masks and its advance.

A constraint may wait for a trigger token: until the model samples it, nothing is masked; from
the token after it on, the grammar holds. The image and audio output paths use this to keep
an image-code or audio-unit span well formed once the model opens one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import llguidance
import llguidance.numpy as llg_np
import numpy as np

log = logging.getLogger("omni.constrained")


class TokenConstraint:
    def __init__(
        self, matcher: llguidance.LLMatcher, vocab_size: int, trigger_token_id: int | None = None
    ) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size  # the tokenizer's: a mask has ceil(vocab_size / 32) words
        self.trigger_token_id = trigger_token_id
        self.active = trigger_token_id is None
        self.violated = False  # a token the grammar refused got through (never expected)

    @property
    def complete(self) -> bool:
        """The grammar can take no more tokens: the request ends here ("stop")."""
        return self.active and self.matcher.is_stopped()

    def advance(self, token_id: int) -> None:
        """Record a sampled token; read complete and violated after it."""
        if not self.active:
            if token_id == self.trigger_token_id:
                self.active = True
            return
        if not self.matcher.consume_token(token_id):
            # Only a mask that never reached the sampler lets this happen; the request is
            # ended rather than continued from a state the grammar cannot describe.
            log.error("token %d violates the grammar: %s", token_id, self.matcher.get_error())
            self.violated = True


def fill_masks(constraints: Sequence[TokenConstraint]) -> list[bytes]:
    """The next-token bitmask of each (active) constraint: little-endian int32 words, bit t
    of the mask set when token t is allowed."""
    masks = []
    for c in constraints:
        words = llg_np.allocate_token_bitmask(1, c.vocab_size)
        llg_np.fill_next_token_bitmask(c.matcher, words)
        masks.append(words[0].astype("<i4", copy=False).tobytes())
    return masks


class MaskFiller:
    """One engine's mask computation. A step with several constrained requests fills their
    masks in parallel on llguidance's own threads (they release the GIL), from a worker thread,
    so the event loop does not wait on them; a single mask (tens of microseconds) is filled
    inline, where a thread hop would cost more than it saves."""

    def __init__(self, num_threads: int | None = None) -> None:
        self._num_threads = num_threads
        self._executor: llguidance.LLExecutor | None = None

    async def fill(self, constraints: Sequence[TokenConstraint]) -> list[bytes]:
        if len(constraints) <= 1:
            return fill_masks(constraints)
        return await asyncio.to_thread(self._fill_parallel, constraints)

    def _fill_parallel(self, constraints: Sequence[TokenConstraint]) -> list[bytes]:
        if self._executor is None:
            self._executor = llguidance.LLExecutor(self._num_threads)
        vocab = constraints[0].vocab_size
        assert all(c.vocab_size == vocab for c in constraints), "one model, one tokenizer"
        words = llg_np.allocate_token_bitmask(len(constraints), vocab)
        llg_np.fill_next_token_bitmask_par(self._executor, [(c.matcher, i) for i, c in enumerate(constraints)], words)
        return [row.astype("<i4", copy=False).tobytes() for row in words]


def allowed_tokens(mask: bytes, vocab_size: int) -> np.ndarray:
    """The token ids a mask allows (for tests and diagnostics)."""
    bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)
