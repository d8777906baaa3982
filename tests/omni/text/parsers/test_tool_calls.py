"""Tool call parsers: what each format reads as a call and as content, and that streaming any
chunking of an output gives exactly what parsing it whole gives."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni.text.parsers.tool_calls import (
    HermesToolParser,
    HyperCLOVAXToolParser,
    JsonArgumentsParser,
    JsonCallsParser,
    ToolCall,
    ToolFunction,
    ToolParser,
    tool_parser_class,
)

WEATHER = ToolFunction(
    "get_weather",
    "Current weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "unit": {"enum": ["c", "f"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "code": {"type": "string"},
        },
    },
)
TOOLS = [WEATHER, ToolFunction("ping")]

CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def hermes(name: str, args: str, key: str = "arguments") -> str:
    return f'<tool_call>\n{{"name": "{name}", "{key}": {args}}}\n</tool_call>'


HERMES_OUTPUTS = [
    "",
    "Just an answer, no tools.",
    hermes("get_weather", '{"city": "Seoul"}'),
    "Let me check.\n\n" + hermes("get_weather", '{"city": "서울", "days": 3}'),
    hermes("get_weather", '{"city": "Seoul"}') + "\n" + hermes("ping", "{}") + "\n",
    hermes("get_weather", '{"city":"Busan"}', key="parameters") + "  trailing words ",
    hermes("nope", '{"x": [1, 2, {"y": null}]}'),  # a function not in tools is still a call
    '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Jeju\\"}"}\n</tool_call>',
    "<tool_call>\n{not json}\n</tool_call> and after",  # malformed: stays as written
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>{"name": "f", "arguments": NaN}</tool_call>',
    "before " + hermes("ping", "{}") + ' <tool_call>\n{"name": "ping"',  # unclosed at the end
    "a <tool b <tool_ c <tool_call d",
    "emoji 🙂 " + hermes("get_weather", '{"city": "😀 café"}') + " <tool_call",
    "</tool_call> stray end " + hermes("ping", "{}"),
    "<tool_call>garbage <tool_call>" + '{"name": "ping"}' + "</tool_call>",
]


def hcx(name: str, *pairs: tuple[str, str]) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs)
    return f"<tool_call>{name}\n{body}</tool_call>"


HCX_OUTPUTS = [
    "",
    "plain text",
    hcx("get_weather", ("city", "Seoul")),
    "Checking.\n" + hcx("get_weather", ("city", "Seoul"), ("days", "3"), ("unit", "c")),
    hcx("get_weather", ("city", "123"), ("tags", '["a", "b"]'), ("other", "not json"), ("more", '{"k": 1}')),
    hcx("ping") + "\n\n" + hcx("get_weather", ("city", " spaced  ")) + "\n",
    "<tool_call> ping </tool_call>",
    "<tool_call>\nget_weather\n<arg_key> city </arg_key>\n\n<arg_value>Daegu</arg_value></tool_call> after",
    "<tool_call>get_weather junk<arg_key>city</arg_key><arg_value>x</arg_value></tool_call>",  # malformed
    "<tool_call>get_weather<arg_key>city</arg_key>stray<arg_value>x</arg_value></tool_call>",  # malformed
    "<tool_call></tool_call>",  # no name
    hcx("get_weather", ("city", "a")) + "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seo",
    hcx("unknown_fn", ("n", "1.5"), ("s", "hello")),
    "x <tool_ca y <arg_key> z",
    hcx("get_weather", ("city", "부산 🙂"), ("code", '{"not": "parsed"}'), ("days", "three")),
]


def stream(parser: ToolParser, chunks: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """Concatenate the streamed content and each call's pieces, checking the pieces' shape."""
    content = ""
    calls: list[tuple[str, str]] = []
    for delta_content, deltas in [parser.push(c) for c in chunks] + [parser.finish()]:
        content += delta_content
        for d in deltas:
            if d.index == len(calls):  # a new call: its first piece names it
                assert d.id is not None and CALL_ID.fullmatch(d.id) and d.name is not None
                calls.append((d.name, d.arguments))
            else:
                assert d.index == len(calls) - 1 and d.id is None and d.name is None
                calls[-1] = (calls[-1][0], calls[-1][1] + d.arguments)
    return content, calls


@st.composite
def chunked(draw: st.DrawFn, outputs: list[str], fragments: list[str]) -> tuple[str, list[str]]:
    """An example output or one assembled from fragments, cut at arbitrary places."""
    text = draw(st.sampled_from(outputs) | st.lists(st.sampled_from(fragments), max_size=10).map("".join))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in itertools.pairwise(bounds)]


FRAGMENTS = [" ", "\n", "\n\n", "text", "é🙂", "<", "<tool", "<tool_call", "<tool_call>", "</tool_call>", "</tool"]
HERMES_FRAGMENTS = FRAGMENTS + ['{"name": "ping"}', '{"name": "get_weather", "arguments": {"city": "x"}}', "{bad"]
HCX_FRAGMENTS = FRAGMENTS + [
    "ping",
    "get_weather",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "city",
    "days",
    "7",
]


def check_stream_equals_parse(parser_class: type[ToolParser], text: str, chunks: list[str]) -> None:
    content, calls = parser_class(TOOLS).parse(text)
    streamed_content, streamed_calls = stream(parser_class(TOOLS), chunks)
    assert streamed_content == content
    assert streamed_calls == [(c.name, c.arguments) for c in calls]


@settings(max_examples=200, deadline=None)
@given(chunked(HERMES_OUTPUTS, HERMES_FRAGMENTS))
def test_hermes_streaming_equals_parsing(example: tuple[str, list[str]]) -> None:
    check_stream_equals_parse(HermesToolParser, *example)


@settings(max_examples=200, deadline=None)
@given(chunked(HCX_OUTPUTS, HCX_FRAGMENTS))
def test_hyperclovax_streaming_equals_parsing(example: tuple[str, list[str]]) -> None:
    check_stream_equals_parse(HyperCLOVAXToolParser, *example)


@pytest.mark.parametrize(
    "parser_class, outputs", [(HermesToolParser, HERMES_OUTPUTS), (HyperCLOVAXToolParser, HCX_OUTPUTS)]
)
def test_every_example_streams_char_by_char_as_parsed(parser_class: type[ToolParser], outputs: list[str]) -> None:
    for text in outputs:
        check_stream_equals_parse(parser_class, text, list(text))
        check_stream_equals_parse(parser_class, text, [text])


def named(calls: list[ToolCall]) -> list[tuple[str, object]]:
    for c in calls:
        assert CALL_ID.fullmatch(c.id)
    assert len({c.id for c in calls}) == len(calls)
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_hermes_reads_calls_and_keeps_the_text_around_them() -> None:
    parser = HermesToolParser(TOOLS)
    content, calls = parser.parse(HERMES_OUTPUTS[4])
    assert (content, named(calls)) == ("", [("get_weather", {"city": "Seoul"}), ("ping", {})])
    content, calls = parser.parse(HERMES_OUTPUTS[3])
    assert content == "Let me check."  # the blank lines before the call are layout
    assert calls[0].arguments == '{"city": "서울", "days": 3}'  # json.dumps, not ASCII-escaped
    content, calls = parser.parse(HERMES_OUTPUTS[5])
    assert (content, named(calls)) == ("trailing words ", [("get_weather", {"city": "Busan"})])
    assert named(parser.parse(HERMES_OUTPUTS[6])[1]) == [("nope", {"x": [1, 2, {"y": None}]})]
    assert named(parser.parse(HERMES_OUTPUTS[7])[1]) == [("get_weather", {"city": "Jeju"})]  # arguments as a string


@pytest.mark.parametrize("index", [8, 9, 10])
def test_a_malformed_hermes_call_stays_in_the_content(index: int) -> None:
    text = HERMES_OUTPUTS[index]
    assert HermesToolParser(TOOLS).parse(text) == (text, [])


def test_an_unclosed_call_is_content_as_written() -> None:
    content, calls = HermesToolParser(TOOLS).parse(HERMES_OUTPUTS[11])
    assert content == 'before<tool_call>\n{"name": "ping"'  # the space touched a call; the rest is raw
    assert named(calls) == [("ping", {})]
    text = HCX_OUTPUTS[11]
    content, calls = HyperCLOVAXToolParser(TOOLS).parse(text)
    assert content == text[text.index("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seo") :]
    assert named(calls) == [("get_weather", {"city": "a"})]


def test_a_call_nested_in_a_malformed_one_is_not_read() -> None:
    # The first </tool_call> closes the first <tool_call>; that body is not a call.
    text = HERMES_OUTPUTS[15]
    assert HermesToolParser(TOOLS).parse(text) == (text, [])


def test_hyperclovax_types_values_by_the_schema() -> None:
    parser = HyperCLOVAXToolParser(TOOLS)
    content, calls = parser.parse(HCX_OUTPUTS[4])
    assert content == ""
    # city is a string property: "123" stays text; tags is JSON; unknown keys are JSON when they parse
    assert named(calls) == [("get_weather", {"city": "123", "tags": ["a", "b"], "other": "not json", "more": {"k": 1}})]
    assert named(parser.parse(HCX_OUTPUTS[14])[1]) == [
        ("get_weather", {"city": "부산 🙂", "code": '{"not": "parsed"}', "days": "three"})  # not JSON: the text
    ]
    assert named(parser.parse(HCX_OUTPUTS[12])[1]) == [("unknown_fn", {"n": 1.5, "s": "hello"})]
    assert named(parser.parse(HCX_OUTPUTS[5])[1]) == [("ping", {}), ("get_weather", {"city": " spaced  "})]
    content, calls = parser.parse(HCX_OUTPUTS[7])  # whitespace between the parts is layout
    assert (content, named(calls)) == ("after", [("get_weather", {"city": "Daegu"})])


@pytest.mark.parametrize("index", [8, 9, 10])
def test_a_malformed_hyperclovax_call_stays_in_the_content(index: int) -> None:
    text = HCX_OUTPUTS[index]
    assert HyperCLOVAXToolParser(TOOLS).parse(text) == (text, [])


def test_hyperclovax_streams_one_piece_per_argument() -> None:
    parser = HyperCLOVAXToolParser(TOOLS)
    text = HCX_OUTPUTS[3]
    pieces = [parser.push(ch) for ch in text] + [parser.finish()]
    content = "".join(c for c, _ in pieces)
    deltas = [d for _, ds in pieces for d in ds]
    assert content == "Checking."
    assert [(d.index, d.name, d.arguments) for d in deltas] == [
        (0, "get_weather", '{"city": "Seoul"'),
        (0, None, ', "days": 3'),
        (0, None, ', "unit": "c"'),
        (0, None, "}"),
    ]


def test_text_that_may_open_a_call_is_held_back_until_it_cannot() -> None:
    parser = HermesToolParser(TOOLS)
    assert parser.push("Hi <tool") == ("Hi", [])  # the space may touch a call; "<tool" may open one
    assert parser.push("box>") == (" <toolbox>", [])
    assert parser.push(" <tool_call>\n{") == ("", [])
    assert parser.finish() == (" <tool_call>\n{", [])


def test_the_registry_names_the_formats() -> None:
    assert tool_parser_class("hermes") is HermesToolParser
    assert tool_parser_class("hyperclovax") is HyperCLOVAXToolParser
    with pytest.raises(ValueError, match="known: glm45, hermes, hyperclovax"):
        tool_parser_class("mistral")
    assert HyperCLOVAXToolParser.markup_tokens[:2] == HermesToolParser.markup_tokens == ("<tool_call>", "</tool_call>")


def stream_cut(parser: ToolParser, chunks: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """stream(), ended by the length limit."""
    finish = parser.finish
    parser.finish = lambda: finish(cut=True)  # type: ignore[method-assign]
    return stream(parser, chunks)


# (output cut by the length limit, content, [(name, arguments as far as written)])
CUT_CALLS: list[tuple[type[ToolParser], str, str, list[tuple[str, str]]]] = [
    # the example: the template's markup never reaches the content
    (HyperCLOVAXToolParser, "<tool_call>get_weather\n<arg_key>city", "", [("get_weather", "{")]),
    (HyperCLOVAXToolParser, "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seo",
     "Checking.", [("get_weather", '{"city": "Seo')]),
    (HyperCLOVAXToolParser, hcx("ping") + "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seoul</arg_value>\n"
     "<arg_key>days</arg_key>\n<arg_value>1", "", [("ping", "{}"), ("get_weather", '{"city": "Seoul", "days": 1')]),
    (HyperCLOVAXToolParser, "Hm <tool_call>get_wea", "Hm", []),  # no whole name: no call, no markup
    (HermesToolParser, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Se', "",
     [("get_weather", '{"city": "Se')]),
    (HermesToolParser, 'Sure.\n<tool_call>\n{"name": "get_weather"', "Sure.", [("get_weather", "")]),
    (HermesToolParser, '<tool_call>\n{"na', "", []),
]


@pytest.mark.parametrize(("parser_class", "text", "content", "calls"), CUT_CALLS)
def test_a_call_the_length_limit_cut_is_a_call_with_its_arguments_as_written(
    parser_class: type[ToolParser], text: str, content: str, calls: list[tuple[str, str]]
) -> None:
    parsed_content, parsed = parser_class(TOOLS).parse(text, cut=True)
    assert (parsed_content, [(c.name, c.arguments) for c in parsed]) == (content, calls)
    for size in (1, 3, len(text) or 1):  # streamed in any pieces, the same
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        assert stream_cut(parser_class(TOOLS), chunks) == (content, calls)
    # not cut (a stop token ended it), an unclosed call stays the text it was
    assert parser_class(TOOLS).parse(text)[0].endswith(text[text.rfind("<tool_call>") :])


# The server's own formats for a forced call on a model whose template has none: the whole
# output is JSON, read when it ends (streamed, the calls come with the last piece).
JSON_CASES: list[tuple[type[ToolParser], list[ToolFunction], str, bool, str, list[tuple[str, str]]]] = [
    # (parser, tools, output, cut, content, calls)
    (JsonCallsParser, TOOLS, '[{"name":"get_weather","parameters":{"city":"Seoul","days":2}},'
     '{"name":"ping","parameters":{}}]', False, "", [("get_weather", '{"city": "Seoul", "days": 2}'), ("ping", "{}")]),
    (JsonCallsParser, TOOLS, '[{"name": "ping", "arguments": {}}]', False, "", [("ping", "{}")]),  # vLLM reads both
    (JsonCallsParser, TOOLS, '[{"name":"ping"', False, '[{"name":"ping"', []),  # not JSON, not cut: content
    (JsonCallsParser, TOOLS, '{"name":"ping"}', False, '{"name":"ping"}', []),  # no list
    (JsonCallsParser, TOOLS, "[]", False, "[]", []),
    (JsonCallsParser, TOOLS, '[{"name":"ping","parameters":{}},{"name":"get_weather","parameters":{"city":"Se',
     True, "", [("ping", "{}"), ("get_weather", '{"city":"Se')]),
    (JsonCallsParser, TOOLS, '[{"name":"get_weather"', True, "", [("get_weather", "")]),
    (JsonCallsParser, TOOLS, '[{"na', True, "", []),  # no whole name: no call, and no JSON as content
    (JsonArgumentsParser, [WEATHER], '{"city":"Busan","unit":"c"}', False, "",
     [("get_weather", '{"city": "Busan", "unit": "c"}')]),
    (JsonArgumentsParser, [WEATHER], '{"city":"Bu', True, "", [("get_weather", '{"city":"Bu')]),
    (JsonArgumentsParser, [WEATHER], '{"city":"Bu', False, '{"city":"Bu', []),
    (JsonArgumentsParser, [WEATHER], "[1]", False, "[1]", []),
]


@pytest.mark.parametrize(("parser_class", "tools", "text", "cut", "content", "calls"), JSON_CASES)
def test_the_json_formats_read_the_whole_output_as_the_calls(
    parser_class: type[ToolParser],
    tools: list[ToolFunction],
    text: str,
    cut: bool,
    content: str,
    calls: list[tuple[str, str]],
) -> None:
    parsed_content, parsed = parser_class(tools).parse(text, cut=cut)
    assert all(CALL_ID.fullmatch(c.id) for c in parsed)
    assert (parsed_content, [(c.name, c.arguments) for c in parsed]) == (content, calls)
    for size in (1, 4, len(text)):
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        parser = parser_class(tools)
        assert all(parser.push(c) == ("", []) for c in chunks)  # nothing before the end
        streamed = stream_cut(parser_class(tools), chunks) if cut else stream(parser_class(tools), chunks)
        assert streamed == (content, calls)
    assert parser_class.markup_tokens == () and tool_parser_class(parser_class.name) is parser_class
