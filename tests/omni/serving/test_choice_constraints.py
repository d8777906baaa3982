"""ChoiceConstraints: a grammar alone holds from the first token, behind a prompt that opened the
reasoning it waits for </think> (holding back the turn's end: the answer or call must come), a
tool call's own trigger wins, a reasoning budget rides on the grammar or stands alone, a model
without reasoning tokens cannot take a budget, and no span opens inside the reasoning. (The
span grammars are the output modalities' own tests.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from omni.engines.pool import ModelPool
from omni.errors import APIError
from omni.modalities.outputs.kind import OutputSpans
from omni.serving.choice_constraints import ChoiceConstraints, TriggeredGrammar, prompt_opens_reasoning
from omni.serving.model import ServedModel
from omni.serving.requests import parse_chat_completion_request
from omni.text.chat_format import ChatFormat
from omni.text.constrained.compiler import CompiledGrammar
from omni.text.constrained.constraint import TokenConstraint, allowed_tokens, fill_masks
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.tokenizer import TextTokenizer
from tests.omni.fake_pool import FakePool

THINK, END_THINK, TOOL_CALL = 1308, 1309, 1310  # the tiny tokenizer's
OPEN = [1281, 1090, 343, 274, 83, 198, THINK, 198]  # "<|im_start|>assistant\n<think>\n"
CLOSED = [1281, 1090, 343, 274, 83, 198]  # "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def model(tiny_tokenizer_dir: Path) -> ServedModel:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    return ServedModel("m", tokenizer, cast(ModelPool, FakePool([1])), created=0, chat_format=ChatFormat(reasoning_parser="think"))


@pytest.fixture
async def grammar(model: ServedModel) -> CompiledGrammar:
    return await model.grammars.compile(GrammarSpec(GrammarKind.GRAMMAR, "%llguidance {}\nstart: <[100]>\n"))


def chat(**fields: Any) -> Any:
    return parse_chat_completion_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def allowed(c: TokenConstraint) -> list[int]:
    (mask,) = fill_masks([c])
    return allowed_tokens(mask, c.vocab_size).tolist()


def test_a_prompt_ending_inside_a_reasoning_block_opens_it(model: ServedModel) -> None:
    assert prompt_opens_reasoning(model, "think", OPEN)
    assert not prompt_opens_reasoning(model, "think", CLOSED)
    assert not prompt_opens_reasoning(model, "think", [*OPEN, 5, END_THINK, 198])


async def test_a_grammar_alone_holds_from_the_first_token(model: ServedModel, grammar: CompiledGrammar) -> None:
    c = ChoiceConstraints(model, chat(), grammar, CLOSED, 16).new()
    assert c is not None and c.active and allowed(c) == [100]


async def test_after_an_opened_reasoning_block_the_grammar_waits_for_its_end(model: ServedModel, grammar: CompiledGrammar) -> None:
    c = ChoiceConstraints(model, chat(), grammar, OPEN, 16).new()
    # until the reasoning ends the grammar is off; only the turn's end and span openers are held back
    assert c is not None and not c.grammar_on and c.holding
    assert len(allowed(c)) == c.vocab_size - len(c.held)
    c.advance(5)
    c.advance(END_THINK)
    assert allowed(c) == [100]


async def test_a_tool_calls_own_trigger_is_kept(model: ServedModel, grammar: CompiledGrammar) -> None:
    c = ChoiceConstraints(model, chat(), TriggeredGrammar(grammar, TOOL_CALL), OPEN, 16).new()
    assert c is not None
    c.advance(END_THINK)
    assert not c.active  # </think> is not its trigger
    c.advance(TOOL_CALL)
    assert allowed(c) == [100]


async def test_a_reasoning_budget_forces_the_end_of_reasoning(model: ServedModel, grammar: CompiledGrammar) -> None:
    alone = ChoiceConstraints(model, chat(thinking_token_budget=1), None, OPEN, 16).new()
    assert alone is not None and alone.matcher is None
    alone.advance(5)
    assert allowed(alone) == [END_THINK]
    with_grammar = ChoiceConstraints(model, chat(thinking_token_budget=0), grammar, OPEN, 16).new()
    assert with_grammar is not None and allowed(with_grammar) == [END_THINK]
    with_grammar.advance(END_THINK)
    assert allowed(with_grammar) == [100]


def test_nothing_asked_is_no_constraint(model: ServedModel) -> None:
    assert ChoiceConstraints(model, chat(), None, OPEN, 16).new() is None


def test_a_budget_needs_the_models_reasoning_tokens(tiny_tokenizer_dir: Path) -> None:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)

    class NoThink(TextTokenizer):
        def token_to_id(self, token: str) -> int | None:
            return None if "think" in token else super().token_to_id(token)

    plain = ServedModel("m", NoThink(tokenizer.hf_tokenizer, tokenizer.eos_token_ids), cast(ModelPool, FakePool([1])), created=0)
    with pytest.raises(APIError) as refused:
        ChoiceConstraints(plain, chat(thinking_token_budget=4), None, CLOSED, 16)
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, "thinking_token_budget", "unsupported_parameter")


async def test_a_forced_call_after_reasoning_holds_back_the_turns_end(model: ServedModel, grammar: CompiledGrammar) -> None:
    """tool_choice "required" (or a named function) behind an opened reasoning block: the call
    must come, so the reasoning may not end the turn; the call grammar holds from </think>."""
    c = ChoiceConstraints(model, chat(), TriggeredGrammar(grammar, None), OPEN, 16).new()
    assert c is not None and c.holding
    assert not set(model.tokenizer.eos_token_ids) & set(allowed(c))
    c.advance(END_THINK)
    assert allowed(c) == [100]


SPAN_START, UNIT = 1297, 1380  # the tiny tokenizer's <|discrete_audio_start|> and its first unit


async def test_no_span_opens_inside_the_reasoning(model: ServedModel, grammar: CompiledGrammar) -> None:
    """Free text with a span kind: while the reasoning is open its opener (and the dialect's
    bare units) are held back, the turn may end; from </think> on a span opens as anywhere."""
    spans = OutputSpans(grammar, SPAN_START, bare_openers=frozenset({UNIT}))
    c = ChoiceConstraints(model, chat(), None, OPEN, 16, [spans]).new()
    assert c is not None and c.holding
    held = set(range(c.vocab_size)) - set(allowed(c))
    assert held == {SPAN_START, UNIT}  # the turn's end is not held: free text may end there
    c.advance(5)
    c.advance(END_THINK)
    assert not c.active  # the span waits for its opener, unmasked
    c.advance(SPAN_START)
    assert allowed(c) == [100]


async def test_a_reasoning_the_model_opens_holds_the_openers_too(model: ServedModel, grammar: CompiledGrammar) -> None:
    c = ChoiceConstraints(model, chat(), None, CLOSED, 16, [OutputSpans(grammar, SPAN_START)]).new()
    assert c is not None and not c.active
    c.advance(THINK)
    assert SPAN_START not in allowed(c)
    c.advance(END_THINK)
    c.advance(SPAN_START)
    assert allowed(c) == [100]
