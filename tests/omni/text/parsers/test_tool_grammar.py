"""A forced tool call always completes, parses and validates: random walks through the grammar's
masks on the tiny tokenizer end within a small token budget, and what they write is a call the
matching parser reads, of an allowed function, with arguments its schema accepts."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from llguidance.gbnf_to_lark import any_to_lark

from omni.errors import APIError
from omni.text.constrained.compiler import CompiledGrammar, GrammarCompiler
from omni.text.constrained.constraint import allowed_tokens, fill_masks
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.parsers.tool_calls import HermesToolParser, ToolFunction, tool_parser_class
from omni.text.parsers.tool_grammar import tool_call_grammar
from omni.text.tokenizer import TextTokenizer

BUDGET = 300  # tokens a walk may take; the e2e tests give a forced call about 200
SEEDS = range(16)

WEATHER = ToolFunction(
    "get_weather",
    "Current weather in a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},  # no maxLength: the grammar bounds it
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city"],
    },
)
BOOKING = ToolFunction(
    "book_table",
    None,
    {
        "type": "object",
        "properties": {
            "guest": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 12}, "vip": {"type": "boolean"}},
                "required": ["name"],
            },
            "dishes": {
                "type": "array",
                "items": {"type": "string", "enum": ["soup", "rice", "kimchi"]},
                "minItems": 1,
                "maxItems": 3,
            },
            "budget": {"type": "number", "exclusiveMinimum": 0, "maximum": 500},
            "code": {"type": "string", "minLength": 2, "maxLength": 5},
        },
        "required": ["guest", "dishes", "code"],
    },
)
SEARCH = ToolFunction(
    "search",
    None,
    {
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": 20},
            "filters": {"type": "array", "items": {"$ref": "#/$defs/filter"}, "maxItems": 2},
            "page": {"type": ["integer", "null"], "minimum": 0, "maximum": 99},
            "lang": {"type": "string", "pattern": "^[a-z]{2}(-[A-Z]{2})?$"},
        },
        "required": ["query"],
        "$defs": {
            "filter": {
                "type": "object",
                "properties": {
                    "field": {"enum": ["date", "size"]},
                    "min": {"type": "integer", "minimum": 0, "maximum": 9},
                },
                "required": ["field"],
            }
        },
    },
)
PING = ToolFunction("ping")  # no parameters: the call's arguments are {}

FUNCTION_SETS = {
    "required": [WEATHER, BOOKING, SEARCH, PING],  # tool_choice "required": any of them
    "named": [BOOKING],  # tool_choice naming one function
}


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def walk(grammar: CompiledGrammar, tokenizer: TextTokenizer, seed: int) -> tuple[str, int, bool]:
    """Sample uniformly among the allowed tokens (end of text included) until the model would
    stop: the grammar is complete, or end of text was sampled where the grammar allows it; or
    the budget ran out. -> (text, number of tokens, whether it stopped on its own)"""
    rng = np.random.default_rng(seed)
    constraint = grammar.new_constraint()
    out: list[int] = []
    while len(out) < BUDGET:
        (mask,) = fill_masks([constraint])
        token = int(rng.choice(allowed_tokens(mask, tokenizer.vocab_size)))
        if token in tokenizer.eos_token_ids:
            assert constraint.matcher is not None and constraint.matcher.is_accepting()
            break
        out.append(token)
        constraint.advance(token)
        assert not constraint.violated
        if constraint.complete:
            break
    else:
        return tokenizer.decode(out, skip_special_tokens=False), len(out), False
    return tokenizer.decode(out, skip_special_tokens=False), len(out), True


@pytest.mark.parametrize(
    "parallel, max_calls", [(False, None), (True, 2), (True, None)], ids=["single", "parallel-2", "parallel"]
)
@pytest.mark.parametrize("functions", list(FUNCTION_SETS), ids=list(FUNCTION_SETS))
@pytest.mark.parametrize("parser_name", ["hermes", "hyperclovax"])
async def test_every_walk_is_a_valid_call(
    tokenizer: TextTokenizer, parser_name: str, functions: str, parallel: bool, max_calls: int | None
) -> None:
    allowed = {f.name: f for f in FUNCTION_SETS[functions]}
    text = tool_call_grammar(parser_name, list(allowed.values()), parallel=parallel, max_calls=max_calls)
    grammar = await GrammarCompiler(tokenizer).compile(GrammarSpec(GrammarKind.GRAMMAR, text, "tool_choice"))
    parser_class = tool_parser_class(parser_name)
    most = 0
    for seed in SEEDS:
        output, num_tokens, stopped = walk(grammar, tokenizer, seed)
        content, calls = parser_class(list(allowed.values())).parse(output)
        if stopped:
            most = max(most, num_tokens)
            assert content == "", output
        else:
            # Only open-ended parallel calls may run out, and only after a complete first call:
            # the one being written when the budget ends stays in the content, unparsed.
            assert parallel and max_calls is None, output
            assert content.startswith("<tool_call>"), output
        assert len(calls) >= 1 if parallel else len(calls) == 1, output
        assert max_calls is None or len(calls) <= max_calls
        for call in calls:
            assert call.name in allowed, output
            parameters = allowed[call.name].parameters
            args = json.loads(call.arguments)
            jsonschema.validate(args, dict(parameters))
            declared = list(parameters.get("properties", {}))
            assert list(args) == [k for k in declared if k in args]  # in the schema's order
        if parser_name == "hermes":  # compact JSON, as response_format has it
            for args in re.findall(r'"arguments": (.*)}\n</tool_call>', output):
                assert not re.search(r"\s", re.sub(r'"(?:\\.|[^"\\])*"', '""', args)), args
    print(f"{parser_name} {functions} parallel={parallel} max_calls={max_calls}: at most {most} tokens")


@pytest.mark.parametrize("parser_name", ["hermes", "hyperclovax"])
def test_the_grammar_reaches_llguidance_as_written(parser_name: str) -> None:
    text = tool_call_grammar(parser_name, [WEATHER, SEARCH], parallel=True)
    assert any_to_lark(text) == text  # the compiler's GRAMMAR path: no GBNF conversion


def test_hyperclovax_writes_the_schema_order_with_optional_parts() -> None:
    text = tool_call_grammar("hyperclovax", [WEATHER], parallel=False)
    assert 'fn0: <tool_call> "get_weather\\n" fn0_0 fn0_1? fn0_2? </tool_call>' in text
    assert 'fn0_1_value: "celsius" | "fahrenheit"' in text  # a string enum is bare text
    assert "/(?s:.{0,48})/" in text  # city has no maxLength: bounded


@pytest.mark.parametrize(
    "args, message",
    [
        (("mistral", [WEATHER]), "no tool call grammar for 'mistral'"),
        (("hermes", []), "at least one function"),
        (("json_arguments", [WEATHER, PING]), "one named function's arguments, not 2"),
    ],
)
def test_what_cannot_be_a_grammar_is_a_value_error(args: tuple[str, list[ToolFunction]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tool_call_grammar(*args, parallel=False)
    with pytest.raises(ValueError, match="max_calls"):
        tool_call_grammar("hermes", [WEATHER], parallel=True, max_calls=0)


def tokenizer_variant(source: Path, target: Path, edit: str) -> TextTokenizer:
    """The tiny tokenizer with <tool_call> and </tool_call> as plain added tokens (Qwen2.5's
    tokenizer has them so) or not in the vocabulary at all."""
    shutil.copytree(source, target)
    markers = ("<tool_call>", "</tool_call>")
    tokenizer_json = json.loads((target / "tokenizer.json").read_text())
    config = json.loads((target / "tokenizer_config.json").read_text())
    decoder = config.get("added_tokens_decoder", {})
    if edit == "not special":
        for token in [*tokenizer_json["added_tokens"], *decoder.values()]:
            if token["content"] in markers:
                token["special"] = False
    else:
        tokenizer_json["added_tokens"] = [t for t in tokenizer_json["added_tokens"] if t["content"] not in markers]
        config["added_tokens_decoder"] = {k: t for k, t in decoder.items() if t["content"] not in markers}
    (target / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return TextTokenizer.from_dir(target)


async def test_markers_need_only_be_tokens_not_special_ones(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    plain = tokenizer_variant(tiny_tokenizer_dir, tmp_path / "plain", "not special")
    spec = GrammarSpec(GrammarKind.GRAMMAR, tool_call_grammar("hermes", [WEATHER], parallel=False), "tool_choice")
    output, _, stopped = walk(await GrammarCompiler(plain).compile(spec), plain, seed=0)
    assert stopped and HermesToolParser([WEATHER]).parse(output)[1]
    missing = tokenizer_variant(tiny_tokenizer_dir, tmp_path / "missing", "absent")
    with pytest.raises(APIError, match='unknown special token: "<tool_call>"'):
        await GrammarCompiler(missing).compile(spec)  # told they are tokens, which they are not
    # Told which markers are tokens (the server asks the tokenizer), the others are text: a
    # checkpoint given a Hermes template its tokenizer was not made for still makes calls.
    text = tool_call_grammar("hermes", [WEATHER], parallel=False, tokens=())
    assert '"<tool_call>"' in text
    grammar = await GrammarCompiler(missing).compile(GrammarSpec(GrammarKind.GRAMMAR, text, "tool_choice"))
    for seed in range(4):
        output, _, stopped = walk(grammar, missing, seed)
        content, calls = HermesToolParser([WEATHER]).parse(output)
        assert stopped and content == "" and len(calls) == 1, output
        jsonschema.validate(json.loads(calls[0].arguments), dict(WEATHER.parameters))


@pytest.mark.parametrize("parser_name", ["hermes", "hyperclovax"])
async def test_an_opened_grammar_completes_the_call_the_model_began(tokenizer: TextTokenizer, parser_name: str) -> None:
    """tool_choice "auto": the grammar is switched on by the model's own <tool_call>, so it
    begins after that token; the text with the token in front is one valid call."""
    functions = list(FUNCTION_SETS)[0]
    allowed = {f.name: f for f in FUNCTION_SETS[functions]}
    text = tool_call_grammar(parser_name, list(allowed.values()), parallel=False, opened=True)
    grammar = await GrammarCompiler(tokenizer).compile(GrammarSpec(GrammarKind.GRAMMAR, text, "tools"))
    parser = tool_parser_class(parser_name)
    for seed in SEEDS[:8]:
        output, _, stopped = walk(grammar, tokenizer, seed)
        assert stopped
        content, calls = parser(list(allowed.values())).parse("<tool_call>" + output)
        assert content == "" and len(calls) == 1, output
        jsonschema.validate(json.loads(calls[0].arguments), dict(allowed[calls[0].name].parameters))
