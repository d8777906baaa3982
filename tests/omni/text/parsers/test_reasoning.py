"""The reasoning parser: where a <think> block is recognized, how it is trimmed, and that
streaming any chunking of an output gives exactly what parsing it whole gives."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni.text.parsers.reasoning import ReasoningParser, reasoning_parser_class

OUTPUTS = [
    "",
    "   ",
    "Plain answer.",
    "<think>\nweigh it\n</think>\n\n The answer.",  # the reference model's layout
    "  \n<think>a</think>b",
    "<think>\n\n</think>\n\nno reasoning really",  # an empty block (Qwen3 with thinking off)
    "<think>\nstill thinking when max_tokens hit\n",
    "<think>unclosed ends in a partial marker </thi",
    "Answer first. <think>this is content</think>",
    "<thinking>not the marker</thinking>",
    "<think>one</think> two </think> three",
    "<think>생각 🤔 中</think>답 🙂",
    "<thi",
    "</think>after an end with no start",
]


def stream(parser: ReasoningParser, chunks: list[str]) -> tuple[str, str]:
    pieces = [parser.push(c) for c in chunks] + [parser.finish()]
    return "".join(r for r, _ in pieces), "".join(c for _, c in pieces)


def check(text: str, chunks: list[str], in_reasoning: bool) -> None:
    reasoning, content = ReasoningParser(in_reasoning=in_reasoning).parse(text)
    assert reasoning != ""  # an empty block is None
    assert stream(ReasoningParser(in_reasoning=in_reasoning), chunks) == (reasoning or "", content)


FRAGMENTS = [" ", "\n", "\n\n", "word", "🤔", "<", "<th", "<think", "<think>", "</think>", "</thi", "</", "t>"]


@st.composite
def chunked(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(st.sampled_from(OUTPUTS) | st.lists(st.sampled_from(FRAGMENTS), max_size=10).map("".join))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=200, deadline=None)
@given(chunked(), st.booleans())
def test_streaming_equals_parsing(example: tuple[str, list[str]], in_reasoning: bool) -> None:
    check(*example, in_reasoning)


@pytest.mark.parametrize("in_reasoning", [False, True])
def test_every_example_streams_char_by_char_as_parsed(in_reasoning: bool) -> None:
    for text in OUTPUTS:
        check(text, list(text), in_reasoning)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Plain answer.", (None, "Plain answer.")),
        ("<think>\nweigh it\n</think>\n\n The answer.", ("weigh it", "The answer.")),
        ("  \n<think>a</think>b", ("a", "b")),
        ("<think>\n\n</think>\n\nno reasoning really", (None, "no reasoning really")),
        ("<think>\nstill thinking when max_tokens hit\n", ("still thinking when max_tokens hit\n", "")),
        ("Answer first. <think>this is content</think>", (None, "Answer first. <think>this is content</think>")),
        ("<think>one</think> two </think> three", ("one", "two </think> three")),
    ],
)
def test_a_block_at_the_start_is_reasoning(text: str, expected: tuple[str | None, str]) -> None:
    assert ReasoningParser().parse(text) == expected


def test_a_prompt_that_opened_the_block_makes_the_output_start_in_it() -> None:
    parser = ReasoningParser(in_reasoning=True)
    assert parser.parse("\nthe template wrote <think>\n</think>\n\nanswer") == ("the template wrote <think>", "answer")
    assert parser.parse("no end at all") == ("no end at all", "")
    assert ReasoningParser(in_reasoning=True).parse("</think>answer") == (None, "answer")


def test_markers_are_held_back_until_known() -> None:
    parser = ReasoningParser()
    assert parser.push(" <thi") == ("", "")
    assert parser.push("nk>\nstep one\n</th") == ("step one", "")
    assert parser.push("ink>\n\nOK") == ("", "OK")
    assert parser.finish() == ("", "")


def test_the_registry_has_the_model_names() -> None:
    for name in ("think", "deepseek_r1", "qwen3", "hyperclovax"):
        assert reasoning_parser_class(name) is ReasoningParser
    with pytest.raises(ValueError, match="known: deepseek_r1, hyperclovax, qwen3, think"):
        reasoning_parser_class("o1")
    assert ReasoningParser.markup_tokens == ("<think>", "</think>")
