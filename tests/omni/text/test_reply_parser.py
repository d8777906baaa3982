"""Reading a reply back into OpenAI's channels: the reasoning first, the tool calls out of what
it leaves, the reference's spoken markup last; the whole text and any chunking of it agree."""

from __future__ import annotations

import json

import pytest

from omni.text.parsers.tool_calls import ToolFunction
from omni.text.reply_parser import ChatDelta, ChatReply, ChoiceParser, OutputFormat

WEATHER = ToolFunction("weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}})
CALL = '<tool_call>{"name": "weather", "arguments": {"city": "Seoul"}}</tool_call>'
CALL2 = '<tool_call>{"name": "weather", "arguments": {"city": "Busan"}}</tool_call>'
REPLY = f"<think>rain?</think>Let me look.{CALL}{CALL2}"


def streamed(parser: ChoiceParser, text: str, size: int, **finish: bool) -> ChatDelta:
    total = ChatDelta()
    for i in range(0, len(text), size):
        total += parser.push(text[i : i + size])
    total += parser.finish(**finish)
    return total


def test_with_no_parser_the_text_is_all_content() -> None:
    parser = OutputFormat().new_parser()
    assert parser.parse(REPLY) == ChatReply(None, REPLY, [])
    assert OutputFormat().markup_tokens == ()
    assert streamed(OutputFormat().new_parser(), REPLY, 3) == ChatDelta("", REPLY, [])


def test_reasoning_then_tool_calls_come_out_of_the_content() -> None:
    fmt = OutputFormat(reasoning_parser="think", tool_parser="hermes", tools=(WEATHER,))
    assert fmt.markup_tokens == ("<think>", "</think>", "<tool_call>", "</tool_call>")
    parser = fmt.new_parser()
    reply = parser.parse(REPLY)
    assert (reply.reasoning, reply.content) == ("rain?", "Let me look.")
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("weather", {"city": "Seoul"}), ("weather", {"city": "Busan"}),
    ]  # fmt: skip
    assert parser.made_calls


@pytest.mark.parametrize("size", [1, 2, 5, 11, 1000])
def test_any_chunking_reads_the_same_as_the_whole(size: int) -> None:
    fmt = OutputFormat(reasoning_parser="think", tool_parser="hermes", tools=(WEATHER,))
    parser = fmt.new_parser()
    total = streamed(parser, REPLY, size)
    assert (total.reasoning, total.content) == ("rain?", "Let me look.")
    names = {d.index: d.name for d in total.tool_calls if d.name is not None}
    arguments = {i: "".join(d.arguments for d in total.tool_calls if d.index == i) for i in names}
    assert names == {0: "weather", 1: "weather"}
    assert [json.loads(arguments[i]) for i in (0, 1)] == [{"city": "Seoul"}, {"city": "Busan"}]
    assert parser.made_calls


def test_parallel_tool_calls_off_keeps_the_first_call_only() -> None:
    fmt = OutputFormat(tool_parser="hermes", tools=(WEATHER,), single_call=True)
    reply = fmt.new_parser().parse(f"{CALL}{CALL2}")
    assert [json.loads(c.arguments) for c in reply.tool_calls] == [{"city": "Seoul"}]
    total = streamed(fmt.new_parser(), f"{CALL}{CALL2}", 4)
    assert {d.index for d in total.tool_calls} == {0}


def test_a_prompt_that_opened_the_reasoning_starts_the_reply_inside_it() -> None:
    fmt = OutputFormat(reasoning_parser="think", in_reasoning=True)
    assert fmt.new_parser().parse("hmm</think>Yes.") == ChatReply("hmm", "Yes.", [])
    assert streamed(fmt.new_parser(), "hmm</think>Yes.", 2) == ChatDelta("hmm", "Yes.", [])
    # without the flag the same text has no reasoning block: it is all content
    assert OutputFormat(reasoning_parser="think").new_parser().parse("hmm</think>Yes.").reasoning is None


def test_a_reply_with_no_call_leaves_made_calls_false() -> None:
    parser = OutputFormat(tool_parser="hermes", tools=(WEATHER,)).new_parser()
    assert parser.parse("Sunny.") == ChatReply(None, "Sunny.", [])
    assert not parser.made_calls


def test_spoken_markup_leaves_only_the_answer() -> None:
    text = "<user_transcript>hi</user_transcript>\n<assistant_transcript>Hello!</assistant_transcript>"
    text += '<audio_decoder_call><speaker_info>{"gender": "f"}</speaker_info>'
    fmt = OutputFormat(spoken_markup=True)
    assert "<assistant_transcript>" in fmt.markup_tokens
    assert fmt.new_parser().parse(text, spoke=True).content == "Hello!"
    assert streamed(fmt.new_parser(), text, 3, spoke=True).content == "Hello!"
