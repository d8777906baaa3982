"""The reference's image tool under a forced call: with image_rules, t2i_model_generation's
discrete_image_token argument is always one whole image span, and the call still ends. Random
walks through the grammar's masks on the tiny tokenizer (a 2 x 3 span, 12 tokens after its
opening one) check it; the hyperclovax parser reads the span back as the argument's text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from llguidance.gbnf_to_lark import any_to_lark

from omni.text.constrained.compiler import CompiledGrammar, GrammarCompiler
from omni.text.constrained.constraint import allowed_tokens, fill_masks
from omni.text.constrained.image_span import END, EOF, EOL, VISION_TOKEN, ImageSpanFormat
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.parsers.tool_calls import HyperCLOVAXToolParser, ToolCall, ToolFunction
from omni.text.parsers.tool_grammar import T2I_ARG, T2I_TOOL, tool_call_grammar
from omni.text.tokenizer import TextTokenizer

BUDGET = 200  # tokens a walk may take: a 2 x 3 span is 13, the prompt at most 20 characters
SEEDS = range(12)
ROWS, COLS = 2, 3

T2I = ToolFunction(
    T2I_TOOL,
    "Draw an image",
    {
        "type": "object",
        # the image argument first, and optional in the schema: the grammar requires it anyway
        "properties": {T2I_ARG: {"type": "string"}, "prompt": {"type": "string", "maxLength": 20}},
        "required": ["prompt"],
    },
)
T2I_BARE = ToolFunction(T2I_TOOL)  # no schema: the image is the only argument
WEATHER = ToolFunction(
    "get_weather",
    None,
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
)


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def fmt(tokenizer: TextTokenizer) -> ImageSpanFormat:
    span = ImageSpanFormat.from_tokenizer(tokenizer, ROWS, COLS)
    assert span is not None
    return span


async def compile_calls(tokenizer: TextTokenizer, text: str) -> CompiledGrammar:
    return await GrammarCompiler(tokenizer).compile(GrammarSpec(GrammarKind.GRAMMAR, text, "tool_choice"))


def walk(grammar: CompiledGrammar, tokenizer: TextTokenizer, seed: int) -> list[int]:
    """Uniformly random allowed tokens until the grammar is complete, or end of text is sampled
    where the grammar accepts; the walk must stop on its own within BUDGET."""
    rng = np.random.default_rng(seed)
    constraint = grammar.new_constraint()
    out: list[int] = []
    while len(out) < BUDGET:
        (mask,) = fill_masks([constraint])
        token = int(rng.choice(allowed_tokens(mask, tokenizer.vocab_size)))
        if token in tokenizer.eos_token_ids:
            assert constraint.matcher is not None and constraint.matcher.is_accepting()
            return out
        out.append(token)
        constraint.advance(token)
        assert not constraint.violated
        if constraint.complete:
            return out
    raise AssertionError(f"the walk did not end within {BUDGET} tokens")


def spans(tokenizer: TextTokenizer, fmt: ImageSpanFormat, ids: list[int]) -> list[list[int]]:
    """Each image span of ids, its opening token included, checked to be one the decoder draws:
    [start, ratio, vision token, (code x COLS, eol) x ROWS, eof, end]."""
    out = []
    starts = [i for i, t in enumerate(ids) if t == fmt.start_token_id]
    for s in starts:
        span = ids[s : s + 1 + fmt.span_tokens]
        assert len(span) == 1 + fmt.span_tokens, "a span was cut short"
        text = [tokenizer.decode([t], skip_special_tokens=False) for t in span]
        assert text[1] in fmt.ratio_tokens and text[2] == VISION_TOKEN and text[-2:] == [EOF, END], text
        rows = span[3:-2]
        for r in range(ROWS):
            row = rows[r * (COLS + 1) : (r + 1) * (COLS + 1)]
            assert all(fmt.code_of(t) is not None for t in row[:-1]), text
            assert tokenizer.decode([row[-1]], skip_special_tokens=False) == EOL, text
        out.append(span)
    return out


def read_calls(
    tokenizer: TextTokenizer, functions: list[ToolFunction], ids: list[int], prefix: str = ""
) -> list[ToolCall]:
    output = prefix + tokenizer.decode(ids, skip_special_tokens=False)
    assert output.endswith("</tool_call>"), output
    content, calls = HyperCLOVAXToolParser(functions).parse(output)
    assert content == "", output
    return calls


def check_image_call(tokenizer: TextTokenizer, call: ToolCall, span: list[int], keys: list[str]) -> None:
    args = json.loads(call.arguments)
    assert call.name == T2I_TOOL and list(args) == keys
    assert args[T2I_ARG] == tokenizer.decode(span, skip_special_tokens=False)  # the whole span, as text


@pytest.mark.parametrize("function", [T2I, T2I_BARE], ids=["schema", "no-schema"])
async def test_the_image_argument_is_one_whole_span(
    tokenizer: TextTokenizer, fmt: ImageSpanFormat, function: ToolFunction
) -> None:
    text = tool_call_grammar("hyperclovax", [function], parallel=False, image_rules=fmt.rules("image"))
    assert any_to_lark(text) == text  # the compiler's GRAMMAR path: no GBNF conversion
    grammar = await compile_calls(tokenizer, text)
    keys = [T2I_ARG, "prompt"] if function is T2I else [T2I_ARG]
    for seed in SEEDS:
        ids = walk(grammar, tokenizer, seed)
        (span,) = spans(tokenizer, fmt, ids)
        (call,) = read_calls(tokenizer, [function], ids)
        check_image_call(tokenizer, call, span, keys)


async def test_an_opened_call_draws_its_span_too(tokenizer: TextTokenizer, fmt: ImageSpanFormat) -> None:
    """tool_choice "auto": the model's own <tool_call> switched the grammar on."""
    text = tool_call_grammar("hyperclovax", [T2I], parallel=False, opened=True, image_rules=fmt.rules("image"))
    grammar = await compile_calls(tokenizer, text)
    for seed in SEEDS[:6]:
        ids = walk(grammar, tokenizer, seed)
        assert tokenizer.token_to_id("<tool_call>") not in ids
        (span,) = spans(tokenizer, fmt, ids)
        (call,) = read_calls(tokenizer, [T2I], ids, prefix="<tool_call>")
        check_image_call(tokenizer, call, span, [T2I_ARG, "prompt"])


async def test_only_the_image_tool_draws(tokenizer: TextTokenizer, fmt: ImageSpanFormat) -> None:
    """Beside another function, parallel: each t2i call holds exactly one span, the others none."""
    functions = [WEATHER, T2I]
    text = tool_call_grammar("hyperclovax", functions, parallel=True, max_calls=2, image_rules=fmt.rules("image"))
    grammar = await compile_calls(tokenizer, text)
    called: set[str] = set()
    for seed in SEEDS:
        ids = walk(grammar, tokenizer, seed)
        calls = read_calls(tokenizer, functions, ids)
        drawn = spans(tokenizer, fmt, ids)
        images = [c for c in calls if c.name == T2I_TOOL]
        assert 1 <= len(calls) <= 2 and len(drawn) == len(images)
        for call, span in zip(images, drawn, strict=True):
            check_image_call(tokenizer, call, span, [T2I_ARG, "prompt"])
        called.update(c.name for c in calls)
    assert called == {WEATHER.name, T2I_TOOL}  # the walks took both


def test_without_image_rules_or_the_image_tool_nothing_changes(fmt: ImageSpanFormat) -> None:
    rules = fmt.rules("image")
    for parser_name in ("hermes", "hyperclovax"):
        plain = tool_call_grammar(parser_name, [WEATHER], parallel=False)
        assert tool_call_grammar(parser_name, [WEATHER], parallel=False, image_rules=rules) == plain
    # hermes writes JSON arguments: an image span is no JSON value, so the rules are ignored
    for function in (T2I, T2I_BARE):
        for opened in (False, True):
            plain = tool_call_grammar("hermes", [function], parallel=False, opened=opened)
            assert tool_call_grammar("hermes", [function], parallel=False, opened=opened, image_rules=rules) == plain
            assert "discrete_image_start" not in plain
    # and hyperclovax without image_rules writes t2i_model_generation as any function
    for function in (T2I, T2I_BARE):
        text = tool_call_grammar("hyperclovax", [function], parallel=False)
        assert not [line for line in text.splitlines() if line.startswith("image") or line.endswith(": image")], text
