"""Each choice's token constraint: the request's grammar (held off until reasoning ends when
the prompt leaves the model inside <think>, or until the model opens a tool call for an "auto"
tool grammar), its thinking_token_budget, and, on a model that makes an output kind and a
request with no grammar of its own (or an "auto" tool grammar), each kind's span grammar.
While the reasoning is open, every span's opener is held back (HeldInReasoning): no media is
drawn in the reasoning. A grammar held off until reasoning ends (an answer format, a forced
tool call) also holds back the end of the turn: the answer comes. Both endpoints (and the
images API) make theirs here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omni.errors import bad_request
from omni.modalities.outputs.kind import OutputSpans
from omni.serving.model import ServedModel
from omni.serving.requests import ChatCompletionRequest, CompletionRequest
from omni.text.constrained.compiler import CompiledGrammar
from omni.text.constrained.constraint import HeldInReasoning, ReasoningBudget, SpanSet, TokenConstraint, WithSpans
from omni.text.parsers.reasoning import prompt_opens_reasoning as opens_reasoning
from omni.text.parsers.reasoning import reasoning_parser_class


@dataclass(frozen=True, slots=True)
class TriggeredGrammar:
    grammar: CompiledGrammar
    trigger_token_id: int | None  # the grammar holds from this token on (None: from the first)


def prompt_opens_reasoning(model: ServedModel, parser: str, prompt_token_ids: Sequence[int]) -> bool:
    """The template ended the prompt inside an open reasoning block (Qwen3 and R1 style)."""
    return opens_reasoning(model.tokenizer, parser, prompt_token_ids)


def span_openers(model: ServedModel) -> list[int]:
    """The tokens that open each media span the model makes."""
    return [kind.opener(made) for kind, made in model.kinds]


class ChoiceConstraints:
    """Makes each choice's TokenConstraint (None when the choice needs none)."""

    def __init__(
        self,
        model: ServedModel,
        req: ChatCompletionRequest | CompletionRequest,
        grammar: CompiledGrammar | TriggeredGrammar | None,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        spans: Sequence[OutputSpans | None] = (),
    ) -> None:
        own_trigger = None
        if isinstance(grammar, TriggeredGrammar):
            own_trigger = grammar.trigger_token_id
            grammar = grammar.grammar
        self._grammar = grammar
        self._max_tokens = max_tokens
        self._vocab_size = model.tokenizer.vocab_size
        self._budget = req.thinking_token_budget
        self._start, self._end = self._reasoning_tokens(model, req)
        parser = model.chat_format.reasoning_parser
        self._opened = prompt_opens_reasoning(model, parser or "think", prompt_token_ids)
        self._in_reasoning = (grammar is not None or self._budget is not None) and self._opened
        # A reasoning model's answer is constrained from the end of its reasoning on; an "auto"
        # tool grammar from the call the model opens.
        self._trigger = own_trigger
        if own_trigger is None and self._in_reasoning and grammar is not None:
            self._trigger = self._end
        # Media spans: alone when the request has no grammar, beside an "auto" tool grammar
        # that waits for its call; a grammar holding the whole output leaves no room for them,
        # nor does one holding the answer after reasoning (a span drawn in the reasoning would
        # be neither the reasoning nor the answer).
        kinds = [k for k in spans if k is not None]
        self._spans = kinds if grammar is None or own_trigger is not None else []
        bare = frozenset().union(*(k.bare_openers for k in kinds))
        # Held while the reasoning is open: an answer format (or a forced call) after reasoning
        # must come, so the model may neither end its turn nor open a media span there; else
        # only the openers of the spans the reply may hold (a span is never reasoning). A
        # reasoning block the model opens itself counts where the model's format reads it.
        self._held: frozenset[int] = frozenset()
        if grammar is not None and own_trigger is None and self._trigger is not None:
            self._held = frozenset(model.tokenizer.eos_token_ids) | frozenset(span_openers(model)) | bare
        elif self._spans and (parser is not None or self._opened) and not any(k.opened for k in self._spans):
            self._held = frozenset(k.start_token_id for k in self._spans) | bare
        if self._start is None or self._end is None:
            self._held = frozenset()  # (a prompt that opened reasoning has the tokens)

    @staticmethod
    def _reasoning_tokens(model: ServedModel, req: ChatCompletionRequest | CompletionRequest) -> tuple[int | None, int | None]:
        parser = model.chat_format.reasoning_parser
        cls = reasoning_parser_class(parser or "think")
        start, end = model.tokenizer.token_to_id(cls.start), model.tokenizer.token_to_id(cls.end)
        if req.thinking_token_budget is not None and (start is None or end is None):
            raise bad_request(
                f"This model has no {cls.start}...{cls.end} tokens to bound its reasoning with.",
                param="thinking_token_budget",
                code="unsupported_parameter",
            )
        return start, end

    def _span_set(self, budget: ReasoningBudget | None = None) -> TokenConstraint:
        """The reply's span kinds as one span-mode constraint (a reasoning budget rides on the
        first: spans are never reasoning)."""
        kinds = [
            k.grammar.new_constraint(k.start_token_id, budget if i == 0 else None, spans=True)
            for i, k in enumerate(self._spans)
        ]
        return kinds[0] if len(kinds) == 1 else SpanSet(kinds)

    def new(self) -> TokenConstraint | None:
        constraint = self._new()
        if not self._held:
            return constraint
        assert self._start is not None and self._end is not None
        inner = constraint if constraint is not None else TokenConstraint(None, self._vocab_size)
        return HeldInReasoning(inner, self._held, self._start, self._end, open=self._opened)

    def _new(self) -> TokenConstraint | None:
        budget = None
        if self._budget is not None:
            assert self._start is not None and self._end is not None
            budget = ReasoningBudget(self._start, self._end, self._budget, open=self._in_reasoning)
        if self._grammar is not None:
            constraint = self._grammar.new_constraint(self._trigger, budget, max_tokens=self._max_tokens)
            if not self._spans:
                return constraint
            return WithSpans(constraint, self._span_set())
        if len(self._spans) == 1 and self._spans[0].opened:  # the whole output is the span the prompt opened
            return self._spans[0].grammar.new_constraint(None, budget)
        if self._spans:
            return self._span_set(budget)
        if budget is not None:
            return TokenConstraint(None, self._vocab_size, budget=budget)
        return None
