"""Grammars compile once per spec, refuse what they cannot compile, and their masks allow
exactly the tokens that keep the output inside the grammar."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import numpy as np
import pytest

from omni.errors import APIError
from omni.text.constrained.compiler import GrammarCompiler
from omni.text.constrained.constraint import MaskFiller, TokenConstraint, allowed_tokens, fill_masks
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.tokenizer import TextTokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 9},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 2},
        "note": {"type": "string", "maxLength": 4},
    },
    "required": ["n", "tags"],
    "additionalProperties": False,
}


def walk(constraint: TokenConstraint, tokenizer: TextTokenizer, seed: int, limit: int = 200) -> str:
    """Sample uniformly among the allowed tokens until the grammar is complete."""
    rng = np.random.default_rng(seed)
    out: list[int] = []
    for _ in range(limit):
        (mask,) = fill_masks([constraint])
        allowed = allowed_tokens(mask, tokenizer.vocab_size)
        allowed = allowed[~np.isin(allowed, list(tokenizer.eos_token_ids))]  # run to completion
        token = int(rng.choice(allowed))
        out.append(token)
        constraint.advance(token)
        assert not constraint.violated
        if constraint.complete:
            return tokenizer.decode(out, skip_special_tokens=False)
    raise AssertionError(f"no completion within {limit} tokens: {tokenizer.decode(out)!r}")


async def test_a_spec_is_compiled_once(compiler: GrammarCompiler) -> None:
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))
    first = await compiler.compile(spec)
    assert await compiler.compile(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))) is first
    assert await compiler.compile(GrammarSpec(GrammarKind.JSON_OBJECT)) is not first


async def test_every_walk_of_a_schema_validates(compiler: GrammarCompiler, tokenizer: TextTokenizer) -> None:
    grammar = await compiler.compile(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA)))
    for seed in range(20):
        text = walk(grammar.new_constraint(), tokenizer, seed)
        jsonschema.validate(json.loads(text), SCHEMA)
        outside_strings = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
        assert not any(ch.isspace() for ch in outside_strings), text  # no free whitespace


@pytest.mark.parametrize(
    "spec, check",
    [
        (GrammarSpec(GrammarKind.CHOICE, json.dumps(["yes", "no way", 'a "quote"'])), lambda t: t in ("yes", "no way", 'a "quote"')),
        (GrammarSpec(GrammarKind.REGEX, r"[0-9]{3}-[a-c]{2}"), lambda t: len(t) == 6 and t[:3].isdigit() and t[3] == "-" and set(t[4:]) <= set("abc")),
        (GrammarSpec(GrammarKind.GRAMMAR, 'root ::= "(" [ab]{1,3} ")"'), lambda t: t[0] == "(" and t[-1] == ")" and 1 <= len(t) - 2 <= 3 and set(t[1:-1]) <= set("ab")),
        (GrammarSpec(GrammarKind.GRAMMAR, 'start: "<" WORD ">"\nWORD: /[xy]{2}/'), lambda t: t in ("<xx>", "<xy>", "<yx>", "<yy>")),
    ],
    ids=["choice", "regex", "gbnf", "lark"],
)
async def test_walks_stay_in_the_grammar(compiler: GrammarCompiler, tokenizer: TextTokenizer, spec: GrammarSpec, check) -> None:  # type: ignore[no-untyped-def]
    grammar = await compiler.compile(spec)
    for seed in range(8):
        text = walk(grammar.new_constraint(), tokenizer, seed, limit=400)
        assert check(text), text


async def test_json_object_takes_an_object_and_nothing_else(compiler: GrammarCompiler, tokenizer: TextTokenizer) -> None:
    grammar = await compiler.compile(GrammarSpec(GrammarKind.JSON_OBJECT))
    c = grammar.new_constraint()
    (mask,) = fill_masks([c])
    starts = {tokenizer.decode([int(t)], skip_special_tokens=False) for t in allowed_tokens(mask, tokenizer.vocab_size)}
    assert starts and all(s.startswith("{") for s in starts)  # an object, never a bare value
    for token in tokenizer.encode('{"a":[1,"b"]}', add_special_tokens=False):
        (mask,) = fill_masks([c])
        assert token in allowed_tokens(mask, tokenizer.vocab_size)
        c.advance(token)
    assert c.matcher.is_accepting() and not c.violated


@pytest.mark.parametrize(
    "spec, message",
    [
        (GrammarSpec(GrammarKind.JSON_SCHEMA, '{"$ref": "#/nope"}', "response_format.json_schema.schema"), "Pointer '/nope' does not exist"),
        (GrammarSpec(GrammarKind.JSON_SCHEMA, "[1, 2]", "guided_json"), "a JSON schema is an object"),
        (GrammarSpec(GrammarKind.REGEX, "(ab", "guided_regex"), "Invalid regular expression in 'guided_regex'"),
        (GrammarSpec(GrammarKind.GRAMMAR, "root ::= (", "structured_outputs.grammar"), "Invalid grammar in 'structured_outputs.grammar'"),
    ],
)
async def test_a_spec_that_does_not_compile_is_a_400_saying_why(compiler: GrammarCompiler, spec: GrammarSpec, message: str) -> None:
    with pytest.raises(APIError) as e:
        await compiler.compile(spec)
    assert (e.value.status, e.value.param, e.value.code) == (400, spec.param, "invalid_grammar")
    assert message in e.value.message


async def test_a_triggered_constraint_masks_nothing_until_its_token(compiler: GrammarCompiler, tokenizer: TextTokenizer) -> None:
    grammar = await compiler.compile(GrammarSpec(GrammarKind.CHOICE, json.dumps(["ab"])))
    trigger = tokenizer.encode("x", add_special_tokens=False)[0]
    c = grammar.new_constraint(trigger_token_id=trigger)
    assert not c.active and not c.complete
    c.advance(trigger + 1)  # any other token: still free text
    assert not c.active
    c.advance(trigger)
    assert c.active and not c.complete
    text = walk(c, tokenizer, seed=0)
    assert text == "ab"


async def test_masks_follow_each_constraint_separately(compiler: GrammarCompiler, tokenizer: TextTokenizer) -> None:
    grammar = await compiler.compile(GrammarSpec(GrammarKind.CHOICE, json.dumps(["ab", "cd"])))
    a, b = grammar.new_constraint(), grammar.new_constraint()
    first_a = tokenizer.encode("a", add_special_tokens=False)[0]
    a.advance(first_a)
    mask_a, mask_b = fill_masks([a, b])
    assert set(allowed_tokens(mask_a, tokenizer.vocab_size)) != set(allowed_tokens(mask_b, tokenizer.vocab_size))
    assert first_a in allowed_tokens(mask_b, tokenizer.vocab_size)


async def test_parallel_masks_equal_the_sequential_ones(compiler: GrammarCompiler, tokenizer: TextTokenizer) -> None:
    grammar = await compiler.compile(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA)))
    constraints = [grammar.new_constraint() for _ in range(5)]
    for i, c in enumerate(constraints):  # five different states
        walk_prefix = tokenizer.encode('{"n":' + str(i + 1), add_special_tokens=False)[: i + 1]
        for token in walk_prefix:
            c.advance(token)
        assert not c.violated
    assert await MaskFiller(num_threads=2).fill(constraints) == fill_masks(constraints)


async def test_concurrent_askers_of_one_spec_share_one_compile(compiler: GrammarCompiler, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[GrammarSpec] = []
    real = compiler._compile

    def counting(spec: GrammarSpec):  # type: ignore[no-untyped-def]
        calls.append(spec)
        return real(spec)

    monkeypatch.setattr(compiler, "_compile", counting)
    a = GrammarSpec(GrammarKind.REGEX, "[ab]{2}")
    b = GrammarSpec(GrammarKind.REGEX, "[cd]{2}")
    got = await asyncio.gather(compiler.compile(a), compiler.compile(a), compiler.compile(b), compiler.compile(a))
    assert got[0] is got[1] is got[3] and got[2] is not got[0]
    assert sorted(calls, key=lambda s: s.source) == [a, b]
