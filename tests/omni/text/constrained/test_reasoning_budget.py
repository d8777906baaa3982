"""thinking_token_budget: after that many reasoning tokens the next one is forced to be the end of
reasoning, alone or ahead of a grammar that starts at that end."""

from __future__ import annotations

import json

from omni.text.constrained.compiler import GrammarCompiler
from omni.text.constrained.constraint import (
    HeldInReasoning,
    MaskFiller,
    ReasoningBudget,
    TokenConstraint,
    allowed_tokens,
    fill_masks,
)
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.tokenizer import TextTokenizer

START, END, OTHER = 1308, 1309, 100


def test_budget_alone_forces_the_end_once_spent() -> None:
    c = TokenConstraint(None, 1400, budget=ReasoningBudget(START, END, max_tokens=2))
    assert not c.active  # no reasoning open yet: nothing to mask
    c.advance(START)
    for _ in range(2):
        assert not c.active
        c.advance(OTHER)
    assert c.active and c.forced_token_id == END
    (mask,) = fill_masks([c])
    assert allowed_tokens(mask, 1400).tolist() == [END]
    c.advance(END)
    assert not c.active and not c.complete
    c.advance(START)  # reasoning is closed for good: a later <think> opens nothing
    for _ in range(5):
        c.advance(OTHER)
    assert not c.active


def test_an_open_prompt_counts_from_the_first_token_and_zero_forces_at_once() -> None:
    c = TokenConstraint(None, 1400, budget=ReasoningBudget(START, END, max_tokens=0, open=True))
    assert c.forced_token_id == END
    c = TokenConstraint(None, 1400, budget=ReasoningBudget(START, END, max_tokens=3, open=True))
    for _ in range(3):
        assert c.forced_token_id is None
        c.advance(OTHER)
    assert c.forced_token_id == END


def test_the_model_ending_early_spends_nothing_more() -> None:
    c = TokenConstraint(None, 1400, budget=ReasoningBudget(START, END, max_tokens=5, open=True))
    c.advance(OTHER)
    c.advance(END)
    for _ in range(10):
        c.advance(OTHER)
        assert not c.active


async def test_budget_then_grammar_from_the_end_of_reasoning(compiler: GrammarCompiler, tokenizer: TextTokenizer) -> None:
    start, end = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
    assert start is not None and end is not None
    grammar = await compiler.compile(GrammarSpec(GrammarKind.CHOICE, json.dumps(["yes", "no"])))
    c = grammar.new_constraint(trigger_token_id=end, budget=ReasoningBudget(start, end, 1, open=True))
    assert not c.active
    c.advance(OTHER)  # the one reasoning token the budget allows
    masks = await MaskFiller().fill([c, grammar.new_constraint()])  # the parallel path too
    assert allowed_tokens(masks[0], tokenizer.vocab_size).tolist() == [end]
    assert len(allowed_tokens(masks[1], tokenizer.vocab_size)) > 1
    c.advance(end)
    assert c.active and c.forced_token_id is None
    allowed = set(allowed_tokens(fill_masks([c])[0], tokenizer.vocab_size).tolist())
    assert tokenizer.encode("yes", add_special_tokens=False)[0] in allowed and end not in allowed


async def test_held_tokens_are_refused_until_the_grammar_holds(compiler: GrammarCompiler, tokenizer: TextTokenizer) -> None:
    """An answer format after reasoning: the reasoning may not end the turn (EOS) nor open a
    span; once </think> comes, the grammar alone decides (a budget still forces its end)."""
    start, end = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
    assert start is not None and end is not None
    eos = min(tokenizer.eos_token_ids)
    held = frozenset({eos, OTHER})
    grammar = await compiler.compile(GrammarSpec(GrammarKind.CHOICE, json.dumps(["yes", "no"])))
    c = HeldInReasoning(grammar.new_constraint(trigger_token_id=end), held, start, end, open=True)
    plain = grammar.new_constraint(trigger_token_id=end)
    assert c.active and not plain.active  # a held constraint masks while it waits
    for masks in (fill_masks([c]), await MaskFiller().fill([c, grammar.new_constraint()])):
        allowed = set(allowed_tokens(masks[0], tokenizer.vocab_size).tolist())
        assert allowed == set(range(tokenizer.vocab_size)) - held
    inner = grammar.new_constraint(trigger_token_id=end, budget=ReasoningBudget(start, end, 0, open=True))
    budget = HeldInReasoning(inner, held, start, end, open=True)
    assert allowed_tokens(fill_masks([budget])[0], tokenizer.vocab_size).tolist() == [end]
    c.advance(end)
    assert c.active and not c.holding
    allowed = set(allowed_tokens(fill_masks([c])[0], tokenizer.vocab_size).tolist())
    assert tokenizer.encode("yes", add_special_tokens=False)[0] in allowed and OTHER not in allowed


def test_held_tokens_wait_for_a_reasoning_the_model_opens_and_end_with_it() -> None:
    """Not opened by the prompt: nothing is held until the model samples <think>, then until
    </think>; a later <think> opens nothing. A span the inner constraint holds decides alone."""
    c = HeldInReasoning(TokenConstraint(None, 1400), frozenset({OTHER}), START, END, open=False)
    assert not c.active
    c.advance(5)
    assert not c.active
    c.advance(START)
    assert c.active and OTHER not in allowed_tokens(fill_masks([c])[0], 1400).tolist()
    c.advance(END)
    assert not c.active
    c.advance(START)
    assert not c.active and not c.complete
