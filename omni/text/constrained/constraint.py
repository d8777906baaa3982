"""TokenConstraint: one request's grammar matcher, its token masks and its advance.

A constraint may wait for a trigger token: until the model samples it, nothing is masked; from
the token after it on, the grammar holds. The image and audio output paths use this to keep
an image-code or audio-unit span well formed once the model opens one, and a reasoning model's
answer is held to its grammar from the </think> that ends its reasoning.

A constraint may also carry a reasoning budget (the request's thinking_token_budget): once
that many tokens of reasoning are out, the next token is forced to be the end of reasoning.
A budget alone, with no grammar, is a constraint too: it masks only that one step.

HeldInReasoning wraps a constraint with tokens refused while the reasoning is open: no media
span is drawn in the reasoning (its openers are held), and an answer that must come (an answer
format, a forced tool call) may not end the turn there either (EOS is held too).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import llguidance
import llguidance.numpy as llg_np
import numpy as np

from omni.text.constrained.json_close import JsonCloser

log = logging.getLogger("omni.text.constrained")


@dataclass(slots=True)
class ReasoningBudget:
    """At most max_tokens between the start and end tokens of reasoning. The reasoning is open
    from the first token when the prompt already opened it, else from a start token the model
    samples; it closes at the first end token."""

    start_token_id: int
    end_token_id: int
    max_tokens: int
    open: bool = False
    used: int = 0
    closed: bool = False

    @property
    def exhausted(self) -> bool:
        return self.open and self.used >= self.max_tokens

    def advance(self, token_id: int) -> None:
        if self.open:
            if token_id == self.end_token_id:
                self.open, self.closed = False, True
            else:
                self.used += 1
        elif not self.closed and token_id == self.start_token_id:
            self.open = True


class TokenConstraint:
    holding = False  # tokens are refused apart from any grammar (HeldInReasoning)

    def __init__(
        self,
        matcher: llguidance.LLMatcher | None,
        vocab_size: int,
        trigger_token_id: int | None = None,
        budget: ReasoningBudget | None = None,
        closer: JsonCloser | None = None,
        spans: bool = False,
    ) -> None:
        self.matcher = matcher  # None: a reasoning budget only
        self.vocab_size = vocab_size  # the tokenizer's: a mask has ceil(vocab_size / 32) words
        self.trigger_token_id = trigger_token_id
        self.grammar_on = matcher is not None and trigger_token_id is None
        self.budget = budget
        self.closer = closer  # json_object: closes the answer before max_tokens cuts it
        # Span mode: the grammar holds each span the trigger opens, and the text between spans
        # is free (image and audio spans in a reply); the request never ends for the grammar.
        assert not spans or trigger_token_id is not None, "spans open at a trigger token"
        self.spans = spans
        self.num_spans = 0  # spans completed
        self.violated = False  # a token the grammar refused got through (never expected)

    @property
    def forced_token_id(self) -> int | None:
        """The one token the next step may sample (the end of an exhausted reasoning budget)."""
        if self.budget is not None and self.budget.exhausted:
            return self.budget.end_token_id
        if self.closer is not None and self.grammar_on:
            return self.closer.forced_token_id
        return None

    @property
    def active(self) -> bool:
        """The next sampled token needs a mask."""
        return self.grammar_on or self.forced_token_id is not None

    @property
    def complete(self) -> bool:
        """The answer is whole: the grammar takes no more tokens, or the closer closed it. The
        request ends here, "stop" (or "length" when cut_short)."""
        if not self.grammar_on or self.matcher is None or self.spans:
            return False
        if self.closer is not None and self.closer.closing_now and not self.closer.scanner.closing():
            return True
        return self.matcher.is_stopped()

    @property
    def cut_short(self) -> bool:
        """The closer had to end the answer early: it was cut by max_tokens, if well formed."""
        return self.closer is not None and self.closer.closing_now

    @property
    def speculable(self) -> bool:
        """Drafts can be checked against it: a grammar from the first token, nothing beside it
        (a trigger, a reasoning budget, a closer, spans or held tokens keep state that a
        rejected draft would have to undo)."""
        return (
            type(self) is TokenConstraint
            and self.matcher is not None
            and self.grammar_on
            and self.budget is None
            and self.closer is None
            and not self.spans
        )

    def draft_prefix(self, drafts: Sequence[int]) -> int:
        """How many of drafts, in order, the grammar takes without ending the answer (a draft
        that would complete it is left for the step to sample: the request ends at it). The
        matcher stays as it is: drafts go to a copy (llguidance 1.9's rollback to the state
        before the first token breaks once a mask was filled there)."""
        assert self.matcher is not None and self.speculable
        # an id past the tokenizer's vocabulary (a model's padded rows) stops llguidance's matcher
        known = next((i for i, t in enumerate(drafts) if not 0 <= t < self.vocab_size), len(drafts))
        valid = self.matcher.validate_tokens(list(drafts[:known])) if known else 0
        if valid == 0:
            return 0
        probe = self.matcher.deep_copy()
        for taken, token_id in enumerate(drafts[:valid]):
            probe.consume_token(token_id)
            if probe.is_stopped():
                return taken
        return valid

    def draft_masks(self, drafts: Sequence[int]) -> bytes:
        """The masks of the rows that verify drafts (from draft_prefix): the next token's, then
        the one after each draft, one after another. The matcher stays as it is."""
        assert self.matcher is not None and self.speculable
        probe = self.matcher.deep_copy()
        masks = [grammar_mask(probe, self.vocab_size)]
        for token_id in drafts:
            probe.consume_token(token_id)
            masks.append(grammar_mask(probe, self.vocab_size))
        return b"".join(masks)

    def advance(self, token_id: int) -> None:
        """Record a sampled token; read complete and violated after it."""
        if self.budget is not None:
            self.budget.advance(token_id)
        if self.matcher is None:
            return
        if not self.grammar_on:
            if self.closer is not None:
                self.closer.spend()
            if token_id == self.trigger_token_id:
                self.grammar_on = True
            return
        if self.closer is not None:
            self.closer.advance(token_id)
        if not self.matcher.consume_token(token_id):
            # Only a mask that never reached the sampler lets this happen; the request is
            # ended rather than continued from a state the grammar cannot describe.
            log.error("token %d violates the grammar: %s", token_id, self.matcher.get_error())
            self.violated = True
        elif self.spans and self.matcher.is_stopped():  # the span is whole: free text again
            self.grammar_on = False
            self.num_spans += 1
            self.matcher.reset()


class HeldInReasoning(TokenConstraint):
    """Another constraint (inner), with the held tokens refused while the reasoning is open and
    the inner grammar is not holding (a span or a call it holds decides alone). The reasoning
    is open from the first token when the prompt opened it, else from a start token the model
    samples; it closes at the first end token, for good: from then on the inner constraint
    alone decides."""

    def __init__(  # noqa: D107
        self, inner: TokenConstraint, held: frozenset[int], start_token_id: int, end_token_id: int, *, open: bool
    ) -> None:
        self.inner = inner
        self.held = held
        self.start_token_id = start_token_id
        self.end_token_id = end_token_id
        self.open = open
        self.closed = False
        self._held_mask: bytes | None = None  # made once, at the first step that needs it

    @property
    def holding(self) -> bool:  # type: ignore[override]
        return self.open and not self.inner.grammar_on

    def held_mask(self) -> bytes:
        """The mask while holding: every token but the held ones (the same at every step)."""
        if self._held_mask is None:
            self._held_mask = all_but_mask(self.held, self.vocab_size)
        return self._held_mask

    @property
    def matcher(self) -> llguidance.LLMatcher | None:  # type: ignore[override]
        return self.inner.matcher

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return self.inner.vocab_size

    @property
    def grammar_on(self) -> bool:  # type: ignore[override]
        return self.inner.grammar_on

    @property
    def forced_token_id(self) -> int | None:
        return self.inner.forced_token_id

    @property
    def active(self) -> bool:
        return self.inner.active or self.holding

    @property
    def complete(self) -> bool:
        return self.inner.complete

    @property
    def cut_short(self) -> bool:
        return self.inner.cut_short

    @property
    def violated(self) -> bool:  # type: ignore[override]
        return self.inner.violated

    @property
    def num_spans(self) -> int:  # type: ignore[override]
        return self.inner.num_spans

    def advance(self, token_id: int) -> None:
        if self.open and token_id == self.end_token_id:
            self.open, self.closed = False, True
        elif not self.open and not self.closed and token_id == self.start_token_id:
            self.open = True
        self.inner.advance(token_id)


class WithSpans(TokenConstraint):
    """A triggered grammar (tool_choice "auto": from the model's <tool_call> on) and span-mode
    constraint (image spans) side by side. They never hold together: while one is on, the
    other waits and sees no tokens; while both are off, both watch for their trigger. The
    request ends as the triggered grammar says; spans never end it."""

    def __init__(self, primary: TokenConstraint, spans: TokenConstraint) -> None:  # noqa: D107
        assert primary.trigger_token_id is not None and spans.spans, "a triggered grammar and a span constraint"
        self.primary = primary
        self.span_constraint = spans

    @property
    def _current(self) -> TokenConstraint:
        return self.span_constraint if self.span_constraint.grammar_on else self.primary

    @property
    def matcher(self) -> llguidance.LLMatcher | None:  # type: ignore[override]
        return self._current.matcher

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return self.primary.vocab_size

    @property
    def grammar_on(self) -> bool:  # type: ignore[override]
        return self.primary.grammar_on or self.span_constraint.grammar_on

    @property
    def forced_token_id(self) -> int | None:
        return self._current.forced_token_id

    @property
    def active(self) -> bool:
        return self._current.active

    @property
    def complete(self) -> bool:
        return self.primary.complete

    @property
    def cut_short(self) -> bool:
        return self.primary.cut_short

    @property
    def violated(self) -> bool:  # type: ignore[override]
        return self.primary.violated or self.span_constraint.violated

    def advance(self, token_id: int) -> None:
        if self.span_constraint.grammar_on:
            self.span_constraint.advance(token_id)
        elif self.primary.grammar_on:
            self.primary.advance(token_id)
        else:
            self.primary.advance(token_id)
            if not self.primary.grammar_on:  # its trigger did not just switch it on
                self.span_constraint.advance(token_id)


class SpanSet(TokenConstraint):
    """Several span kinds in one reply (image spans and audio spans): each span-mode constraint
    watches for its own opening token; once one opens, it alone holds until its span closes.
    Behaves as one span-mode constraint (WithSpans can pair it with a triggered grammar)."""

    def __init__(self, kinds: Sequence[TokenConstraint]) -> None:  # noqa: D107
        assert kinds and all(k.spans for k in kinds), "span-mode constraints"
        self.kinds = list(kinds)
        self.spans = True
        self.trigger_token_id = kinds[0].trigger_token_id
        self.budget = None
        self.closer = None

    @property
    def _open(self) -> TokenConstraint | None:
        return next((k for k in self.kinds if k.grammar_on), None)

    @property
    def matcher(self) -> llguidance.LLMatcher | None:  # type: ignore[override]
        current = self._open
        return current.matcher if current is not None else None

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return self.kinds[0].vocab_size

    @property
    def grammar_on(self) -> bool:  # type: ignore[override]
        return self._open is not None

    @property
    def forced_token_id(self) -> int | None:
        current = self._open
        return (current or self.kinds[0]).forced_token_id  # a reasoning budget rides on the first

    @property
    def complete(self) -> bool:
        return False  # spans never end the reply

    @property
    def violated(self) -> bool:  # type: ignore[override]
        return any(k.violated for k in self.kinds)

    @property
    def num_spans(self) -> int:  # type: ignore[override]
        return sum(k.num_spans for k in self.kinds)

    def advance(self, token_id: int) -> None:
        current = self._open
        if current is not None:
            current.advance(token_id)
            return
        for kind in self.kinds:  # each checks its own opening token
            kind.advance(token_id)
            if kind.grammar_on:
                return


def fill_masks(constraints: Sequence[TokenConstraint]) -> list[bytes]:
    """The next-token bitmask of each (active) constraint: little-endian int32 words, bit t
    of the mask set when token t is allowed."""
    masks = []
    for c in constraints:
        forced = c.forced_token_id
        if forced is not None:
            masks.append(single_token_mask(forced, c.vocab_size))
            continue
        if isinstance(c, HeldInReasoning) and c.holding:
            masks.append(c.held_mask())
            continue
        assert c.matcher is not None, "an active constraint has a grammar or a forced token"
        masks.append(grammar_mask(c.matcher, c.vocab_size))
    return masks


def grammar_mask(matcher: llguidance.LLMatcher, vocab_size: int) -> bytes:
    """The matcher's next-token bitmask."""
    words = llg_np.allocate_token_bitmask(1, vocab_size)
    llg_np.fill_next_token_bitmask(matcher, words)
    return words[0].astype("<i4", copy=False).tobytes()


def all_but_mask(token_ids: frozenset[int], vocab_size: int) -> bytes:
    """Every token of the vocabulary but token_ids."""
    bits = np.ones(vocab_size, dtype=np.uint8)
    bits[[t for t in token_ids if t < vocab_size]] = 0
    words = np.packbits(bits, bitorder="little")
    words = np.pad(words, (0, (-len(words)) % 4))
    return words.view("<i4").tobytes()


def single_token_mask(token_id: int, vocab_size: int) -> bytes:
    words = np.zeros((vocab_size + 31) // 32, dtype="<i4")
    words.view(np.uint32)[token_id // 32] = np.uint32(1 << (token_id % 32))
    return words.tobytes()


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
        grammar_rows = [
            (c.matcher, i)
            for i, c in enumerate(constraints)
            if c.forced_token_id is None and not c.holding and c.matcher is not None
        ]
        if grammar_rows:
            llg_np.fill_next_token_bitmask_par(self._executor, grammar_rows, words)
        masks = [row.astype("<i4", copy=False).tobytes() for row in words]
        for i, c in enumerate(constraints):
            forced = c.forced_token_id
            if forced is not None:
                masks[i] = single_token_mask(forced, vocab)
            elif isinstance(c, HeldInReasoning) and c.holding:
                masks[i] = c.held_mask()
        return masks


def allowed_tokens(mask: bytes, vocab_size: int) -> np.ndarray:
    """The token ids a mask allows (for tests and diagnostics)."""
    bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)
