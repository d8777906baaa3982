"""TokenConstraint and its compositions on a two-token grammar (token 100, then 101 or 102):
the masks it gives, a trigger that switches it on, span mode, the reasoning budget that forces
its end token, several span kinds (SpanSet), a triggered grammar beside spans (WithSpans), and
the masks filled in parallel equal to those filled one by one."""

from __future__ import annotations

import pytest

from omni.text.constrained.compiler import CompiledGrammar, GrammarCompiler
from omni.text.constrained.constraint import (
    MaskFiller,
    ReasoningBudget,
    SpanSet,
    TokenConstraint,
    WithSpans,
    allowed_tokens,
    fill_masks,
    single_token_mask,
)
from omni.text.constrained.spec import GrammarKind, GrammarSpec

TWO = "%llguidance {}\nstart: <[100]> <[101-102]>\n"
OTHER = "%llguidance {}\nstart: <[200]>\n"
THINK, END_THINK = 7, 8


@pytest.fixture
async def two(compiler: GrammarCompiler) -> CompiledGrammar:
    return await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, TWO))


@pytest.fixture
async def other(compiler: GrammarCompiler) -> CompiledGrammar:
    return await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, OTHER))


def allowed(c: TokenConstraint) -> list[int]:
    (mask,) = fill_masks([c])
    return allowed_tokens(mask, c.vocab_size).tolist()


def test_a_single_token_mask_allows_that_token_alone() -> None:
    for token in (0, 31, 32, 1000):
        mask = single_token_mask(token, 1458)
        assert len(mask) == 4 * 46 and allowed_tokens(mask, 1458).tolist() == [token]


async def test_the_grammar_masks_each_step_and_completes(two: CompiledGrammar) -> None:
    c = two.new_constraint()
    assert c.active and allowed(c) == [100]
    c.advance(100)
    assert allowed(c) == [101, 102] and not c.complete
    c.advance(102)
    assert c.complete and not c.violated and not c.cut_short


async def test_a_token_the_grammar_refuses_is_recorded_as_a_violation(two: CompiledGrammar) -> None:
    c = two.new_constraint()
    c.advance(55)
    assert c.violated


async def test_a_trigger_switches_the_grammar_on_after_it(two: CompiledGrammar) -> None:
    c = two.new_constraint(trigger_token_id=9)
    c.advance(5)
    assert not c.active  # free text: no mask needed
    c.advance(9)
    assert c.active and allowed(c) == [100]
    c.advance(100)
    c.advance(101)
    assert c.complete


async def test_in_span_mode_each_span_closes_and_text_is_free_again(two: CompiledGrammar) -> None:
    c = two.new_constraint(trigger_token_id=9, spans=True)
    for token in (9, 100, 101, 4, 9, 100, 102):
        c.advance(token)
    assert (c.num_spans, c.grammar_on, c.complete) == (2, False, False)  # spans never end the reply


def test_a_reasoning_budget_counts_from_its_start_and_stops_at_its_end() -> None:
    budget = ReasoningBudget(THINK, END_THINK, max_tokens=2)
    budget.advance(5)
    assert budget.used == 0 and not budget.open  # not reasoning yet
    for token in (THINK, 1, 2):
        budget.advance(token)
    assert budget.exhausted
    budget.advance(END_THINK)
    assert (budget.closed, budget.exhausted) == (True, False)
    budget.advance(THINK)
    assert not budget.open  # a start token after the end opens nothing


async def test_an_exhausted_budget_forces_the_end_then_the_grammar_holds(two: CompiledGrammar) -> None:
    budget = ReasoningBudget(THINK, END_THINK, max_tokens=1, open=True)
    c = two.new_constraint(trigger_token_id=END_THINK, budget=budget)
    assert not c.active
    c.advance(3)  # one token of reasoning: the budget is spent
    assert c.forced_token_id == END_THINK and allowed(c) == [END_THINK]
    c.advance(END_THINK)  # the end of reasoning is the grammar's trigger too
    assert c.forced_token_id is None and allowed(c) == [100]
    lone = TokenConstraint(None, 1458, budget=ReasoningBudget(THINK, END_THINK, 1, open=True))
    lone.advance(3)
    assert allowed(lone) == [END_THINK] and not lone.complete  # a budget alone masks that one step


async def test_a_span_set_holds_only_the_span_that_opened(two: CompiledGrammar, other: CompiledGrammar) -> None:
    spans = SpanSet([two.new_constraint(trigger_token_id=9, spans=True), other.new_constraint(trigger_token_id=10, spans=True)])
    assert not spans.grammar_on and spans.matcher is None
    spans.advance(10)
    assert allowed(spans) == [200]
    spans.advance(200)
    spans.advance(9)
    assert allowed(spans) == [100]
    spans.advance(100)
    spans.advance(101)
    assert (spans.num_spans, spans.grammar_on, spans.complete, spans.violated) == (2, False, False, False)


async def test_with_spans_the_triggered_grammar_and_the_spans_take_turns(two: CompiledGrammar, other: CompiledGrammar) -> None:
    call = other.new_constraint(trigger_token_id=11)  # a tool call: 200 after <tool_call>
    both = WithSpans(call, two.new_constraint(trigger_token_id=9, spans=True))
    both.advance(9)  # an image span opens
    assert allowed(both) == [100]
    both.advance(100)
    both.advance(101)
    assert not both.grammar_on and not both.complete
    both.advance(11)  # the call opens; the spans wait
    assert allowed(both) == [200]
    both.advance(200)
    assert both.complete  # the call ends the request


async def test_masks_filled_in_parallel_are_those_filled_one_by_one(two: CompiledGrammar, other: CompiledGrammar) -> None:
    constraints = [two.new_constraint(), other.new_constraint(), two.new_constraint()]
    constraints[2].advance(100)
    forced = TokenConstraint(None, constraints[0].vocab_size, budget=ReasoningBudget(THINK, END_THINK, 0, open=True))
    constraints.append(forced)
    expected = fill_masks(constraints)
    assert await MaskFiller(num_threads=2).fill(constraints) == expected
    assert [allowed_tokens(m, forced.vocab_size).tolist() for m in expected] == [[100], [200], [101, 102], [END_THINK]]


THREE = "%llguidance {}\nstart: <[100]> <[101-102]> <[103]> <[104]>\n"


async def test_drafts_are_checked_against_the_grammar_and_rolled_back(compiler: GrammarCompiler) -> None:
    """draft_prefix: the drafts the grammar takes, never the one that completes it; draft_masks:
    each verifying row's mask (before each draft, after the last). Neither moves the matcher."""
    c = (await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, THREE))).new_constraint()
    assert c.speculable and allowed(c) == [100]  # a mask filled first (llguidance's rollback breaks then)
    assert c.draft_prefix([100, 102, 103]) == 3
    assert c.draft_prefix([100, 105, 103]) == 1  # 105 is refused: 100 alone
    assert c.draft_prefix([100, 101, 103, 104]) == 3  # 104 would complete the answer
    assert c.draft_prefix([7]) == 0
    assert c.draft_prefix([100, c.vocab_size + 5, 103]) == 1  # past the tokenizer: never shown to llguidance
    assert c.draft_prefix([c.vocab_size]) == 0 and not c.matcher.is_error()  # type: ignore[union-attr]
    masks = c.draft_masks([100, 101])
    width = len(masks) // 3
    rows = [allowed_tokens(masks[j * width : (j + 1) * width], c.vocab_size).tolist() for j in range(3)]
    assert rows == [[100], [101, 102], [103]]
    assert allowed(c) == [100]  # the matcher is where it was
    c.advance(100)
    assert c.draft_prefix([102, 103, 104]) == 2 and allowed(c) == [101, 102]


async def test_only_a_plain_grammar_speculates(two: CompiledGrammar) -> None:
    assert two.new_constraint().speculable
    assert not two.new_constraint(trigger_token_id=THINK).speculable
    assert not two.new_constraint(budget=ReasoningBudget(THINK, END_THINK, 4)).speculable
    assert not two.new_constraint(trigger_token_id=THINK, spans=True).speculable
