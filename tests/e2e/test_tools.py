"""Tool calling through the real server, in both parser formats: the reference model's
(<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>, the default tiny
checkpoint's template) and Hermes' (JSON inside <tool_call>, a server on tests' Hermes template).

The tiny model has random weights, so only the forced-call grammar can make its calls valid."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import jsonschema
import openai
import pytest

from omni.text.tokenizer import TextTokenizer
from tests.e2e.conftest import SKIP_REASONING
from tests.e2e.server import running_server

MODEL = "omni-tiny"
TEMPLATES = Path(__file__).resolve().parent / "templates"
ASK = [{"role": "user", "content": "What is the weather in Seoul, and what time is it there?"}]
MARKUP = ("<tool_call>", "</tool_call>", "<arg_key>", "<arg_value>", "</arg_value>", "</arg_key>")

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "unit": {"enum": ["c", "f"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {
                    "zone": {"type": "string", "maxLength": 8},
                    "precise": {"type": "boolean"},
                    "where": {
                        "type": "object",
                        "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}},
                        "required": ["lat"],
                        "additionalProperties": False,
                    },
                },
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def hermes_server(tiny_model_dir: Path) -> Iterator[str]:
    with running_server(
        "--model",
        f"{MODEL}={tiny_model_dir}",
        "--max-model-len",
        "2048",
        "--chat-template",
        str(TEMPLATES / "hermes.jinja"),
        "--tool-call-parser",
        "hermes",
    ) as base:
        yield base


@pytest.fixture(scope="module")
def plain_server(tiny_model_dir: Path) -> Iterator[str]:
    """The tiny model on a template with no tool format (SmolLM2's shape): forced calls are JSON."""
    with running_server(
        "--model", f"{MODEL}={tiny_model_dir}", "--max-model-len", "2048",
        "--chat-template", str(TEMPLATES / "plain_tools.jinja"),
    ) as base:  # fmt: skip
        yield base


class Fmt(NamedTuple):
    """A server per tool-call format: its parser, base URL and model; its checkpoint (for the
    tokenizer the tests render with), and what every chat request adds on it."""

    parser: str
    base: str
    model_dir: Path
    model: str = MODEL
    chat: dict[str, Any] = {}


@pytest.fixture(params=["hyperclovax", "hermes", "published"])
def fmt(request: pytest.FixtureRequest, server: str, tiny_model_dir: Path) -> Fmt:
    """The bare checkpoint on its own template (the reference format) and on Hermes', and the
    published-layout default bin/omni-serve serves (the reference format under the reference
    template; its reasoning skipped, which random weights would never close)."""
    if request.param == "hermes":
        return Fmt("hermes", request.getfixturevalue("hermes_server"), tiny_model_dir)
    if request.param == "published":
        published = request.getfixturevalue("speaking_server"), request.getfixturevalue("omni_dir")
        return Fmt("hyperclovax", *published, "omni", SKIP_REASONING)
    return Fmt("hyperclovax", server, tiny_model_dir)


# Room for a few parallel calls: "required" lets the model make as many as it likes, and the
# random model ends its list of calls with even odds after each one.
MAX_TOKENS = {"hyperclovax": 400, "hermes": 1000}


def _client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)


async def _call(client: openai.AsyncOpenAI, stream: bool, on: Fmt | None = None, **fields: Any) -> dict[str, Any]:
    """The reply as one dict: content, finish_reason, and the tool calls (streamed deltas joined)."""
    kw: dict[str, Any] = dict(model=MODEL, messages=ASK, tools=TOOLS, temperature=1.0) | {"max_tokens": 200, **fields}
    if on is not None:
        kw |= {"model": on.model, "extra_body": on.chat | kw.get("extra_body", {})}
    if not stream:
        out = await client.chat.completions.create(**kw)
        choice = out.choices[0]
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in choice.message.tool_calls or []
        ]
        return {"content": choice.message.content, "finish": choice.finish_reason, "calls": calls}
    content, finish = "", None
    calls: dict[int, dict[str, Any]] = {}
    async for chunk in await client.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id is not None:
                    assert call["id"] is None, "the id comes once, on the call's first fragment"
                    call["id"] = d.id
                if d.function is not None:
                    call["name"] = call["name"] or d.function.name
                    call["arguments"] += d.function.arguments or ""
    return {"content": content or None, "finish": finish, "calls": [calls[i] for i in sorted(calls)]}


def _check_calls(reply: dict[str, Any], names: set[str]) -> None:
    assert reply["finish"] == "tool_calls", reply
    assert reply["calls"], reply
    for call in reply["calls"]:
        assert call["id"] and call["id"].startswith("call_")
        assert call["name"] in names, reply
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
    assert not any(m in (reply["content"] or "") for m in MARKUP), reply


async def test_required_and_named_calls_always_validate(fmt: Fmt) -> None:
    parser, base = fmt.parser, fmt.base
    client = _client(base)
    named = {"type": "function", "function": {"name": "get_time"}}
    limit = MAX_TOKENS[parser]
    jobs = [_call(client, on=fmt, stream=i % 2 == 1, seed=i, tool_choice="required", max_tokens=limit) for i in range(20)]
    jobs += [_call(client, on=fmt, stream=i % 2 == 1, seed=100 + i, tool_choice=named, max_tokens=limit) for i in range(20)]
    replies = await asyncio.gather(*jobs)
    for reply in replies[:20]:
        _check_calls(reply, {"get_weather", "get_time"})
    for reply in replies[20:]:
        _check_calls(reply, {"get_time"})
        assert len(reply["calls"]) == 1  # a named function is called once
    # sampled, not fixed: the grammar is what makes every one of them valid
    assert len({json.dumps(r["calls"][0]["arguments"]) for r in replies}) > 20



async def test_a_call_cut_by_max_tokens_is_a_call_with_what_it_wrote(fmt: Fmt) -> None:
    """A forced call the length limit cuts comes back as a tool call with its arguments as far
    as written and finish_reason length, streamed or not, with no markup in the content."""
    parser, base = fmt.parser, fmt.base
    client = _client(base)
    named = {"type": "function", "function": {"name": "get_weather"}}
    sizes = (3, 6, 12) if parser == "hyperclovax" else (4, 12, 24)  # the last one writes the name whole
    for choice in ("required", named):
        for max_tokens in sizes:
            whole, streamed = await asyncio.gather(
                *(_call(client, stream, on=fmt, seed=1, tool_choice=choice, max_tokens=max_tokens) for stream in (False, True))
            )
            for reply in (whole, streamed):
                assert reply["finish"] == "length", reply
                assert not any(m in (reply["content"] or "") for m in MARKUP), reply
                assert all(c["id"].startswith("call_") and c["name"] in SCHEMAS for c in reply["calls"]), reply
            assert [(c["name"], c["arguments"]) for c in whole["calls"]] == [
                (c["name"], c["arguments"]) for c in streamed["calls"]
            ]
            if max_tokens == sizes[-1] and choice is named:
                assert whole["calls"] and whole["calls"][0]["name"] == "get_weather", whole

async def test_a_reply_with_a_cut_call_sent_back_is_answered(server: str) -> None:
    """Issue 37: the assistant message the server wrote, its call cut in its arguments by
    max_tokens, sent back with a tool result: the next turn answers (the reference template
    iterates a call's arguments, so the cut call is left out of the prompt), not a 400."""
    client = _client(server)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for max_tokens in range(3, 24):
        reply = await _call(client, False, seed=1, tool_choice=named, max_tokens=max_tokens)
        if reply["calls"] and not _is_object(reply["calls"][0]["arguments"]):
            break
    else:
        pytest.fail("no limit cut a call in its arguments")
    call = reply["calls"][0]
    turn: dict[str, Any] = {"role": "assistant", "content": reply["content"], "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]}  # fmt: skip
    result = {"role": "tool", "tool_call_id": call["id"], "content": '{"error": "cut"}'}
    messages: Any = [*ASK, turn, result]
    out = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=2)  # type: ignore[arg-type]
    assert out.choices[0].finish_reason in ("stop", "length") and out.usage is not None


def _is_object(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


# The published default with its reasoning on (no skip_reasoning): the template opens <think>,
# which random weights rarely close, and the call grammar holds from its end. Before the turn's
# end and the span openers were held back in the reasoning, seeds 4 and 5 ended the turn there
# ("stop", no call) and seed 3 spoke.
PUBLISHED = "omni"
THINKING_SEEDS = range(8)


async def test_a_forced_call_on_the_published_default_comes_or_the_reply_runs_to_its_length(speaking_server: str) -> None:
    """"required" and a named function with the reasoning on: the reasoning may not end the turn,
    so a reply either calls (after its reasoning, every call valid) or its reasoning runs to
    max_tokens ("length"); never "stop" without a call, never audio or an image in the reasoning."""
    client = _client(speaking_server)
    named = {"type": "function", "function": {"name": "get_time"}}
    for choice, names in (("required", {"get_weather", "get_time"}), (named, {"get_time"})):
        replies = await asyncio.gather(
            *(_call(client, i % 2 == 1, model=PUBLISHED, seed=i, tool_choice=choice, max_tokens=400) for i in THINKING_SEEDS)
        )
        for seed, reply in zip(THINKING_SEEDS, replies, strict=True):
            if reply["finish"] == "tool_calls":
                _check_calls(reply, names)
            else:
                assert reply["finish"] == "length", (seed, reply)
            assert not reply["content"], (seed, reply)  # no image part, no answer beside the call
        assert any(r["finish"] == "tool_calls" for r in replies)
    out = await client.chat.completions.create(
        model=PUBLISHED, messages=ASK, tools=TOOLS, tool_choice="required", seed=3, temperature=1.0, max_tokens=400
    )
    assert out.choices[0].message.audio is None  # the reasoning's bare units are not spoken


async def test_a_forced_call_follows_a_reasoning_that_ends_in_time(speaking_server: str) -> None:
    """With a thinking budget the reasoning ends within max_tokens: every reply calls, streamed or
    not."""
    client = _client(speaking_server)
    budget = {"thinking_token_budget": 30}
    replies = await asyncio.gather(
        *(
            _call(client, i % 2 == 1, model=PUBLISHED, seed=i, tool_choice="required", max_tokens=400, extra_body=budget)
            for i in THINKING_SEEDS
        )
    )
    for reply in replies:
        _check_calls(reply, {"get_weather", "get_time"})


async def test_a_forced_response_on_the_published_default_calls_or_is_incomplete(speaking_server: str) -> None:
    """The Responses API's tool_choice "required" shares chat's path: completed with a call, or
    incomplete for max_output_tokens, never completed without one."""
    client = _client(speaking_server)
    functions = [{"type": "function", **t["function"]} for t in TOOLS]
    statuses = []
    for seed in THINKING_SEEDS:
        out = await client.responses.create(
            model=PUBLISHED, input=ASK[0]["content"], tools=functions, tool_choice="required",  # type: ignore[arg-type]
            temperature=1.0, max_output_tokens=400, extra_body={"seed": seed},
        )  # fmt: skip
        calls = [o for o in out.output if o.type == "function_call"]
        if out.status == "completed":
            assert calls, (seed, out.output)
        else:
            assert out.status == "incomplete" and out.incomplete_details is not None, (seed, out)
            assert out.incomplete_details.reason == "max_output_tokens", (seed, out)
        statuses.append(out.status)
    assert "completed" in statuses


async def test_one_call_only_without_parallel_tool_calls(fmt: Fmt) -> None:
    client = _client(fmt.base)
    replies = await asyncio.gather(
        *(_call(client, on=fmt, stream=i % 2 == 1, seed=i, tool_choice="required", parallel_tool_calls=False) for i in range(6))
    )
    for reply in replies:
        _check_calls(reply, {"get_weather", "get_time"})
        assert len(reply["calls"]) == 1


async def test_streamed_and_whole_replies_are_equal(fmt: Fmt) -> None:
    client = _client(fmt.base)
    for seed in range(3):
        whole, streamed = await asyncio.gather(
            _call(client, on=fmt, stream=False, seed=seed, tool_choice="required", max_tokens=MAX_TOKENS[fmt.parser]),
            _call(client, on=fmt, stream=True, seed=seed, tool_choice="required", max_tokens=MAX_TOKENS[fmt.parser]),
        )
        strip = lambda r: [(c["name"], c["arguments"]) for c in r["calls"]]  # noqa: E731  # ids differ
        assert strip(whole) == strip(streamed) and whole["content"] == streamed["content"]


async def test_tool_choice_none_makes_no_call(fmt: Fmt) -> None:
    """A bias that makes the model open a call at once: with "auto" it does (and the call grammar,
    switched on by that token, makes it well formed); with "none" it cannot."""
    tok = TextTokenizer.from_dir(fmt.model_dir)
    bias = {str(tok.token_to_id("<tool_call>")): 100}
    client = _client(fmt.base)
    autos = await asyncio.gather(
        *(_call(client, on=fmt, stream=i % 2 == 1, seed=i, tool_choice="auto", logit_bias=bias, max_tokens=MAX_TOKENS[fmt.parser]) for i in range(4))
    )
    for auto in autos:
        _check_calls(auto, {"get_weather", "get_time"})
    replies = await asyncio.gather(
        *(_call(client, on=fmt, stream=i % 2 == 1, seed=i, tool_choice="none", logit_bias=bias, max_tokens=8) for i in range(6))
    )
    for reply in replies:
        assert reply["calls"] == [] and reply["finish"] != "tool_calls"
        assert "<tool_call>" not in (reply["content"] or "")


def _render(tok: TextTokenizer, template: str | None, messages: list[dict[str, Any]]) -> int:
    return len(tok.apply_chat_template(messages, tools=TOOLS, chat_template=template))


async def test_the_call_and_its_result_render_into_the_next_prompt(fmt: Fmt) -> None:
    parser, base = fmt.parser, fmt.base
    tok = TextTokenizer.from_dir(fmt.model_dir)
    template = (TEMPLATES / "hermes.jinja").read_text() if parser == "hermes" else None
    client = _client(base)
    first = await _call(client, on=fmt, stream=False, seed=7, tool_choice="required", parallel_tool_calls=False)
    call = first["calls"][0]
    turn = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}],
    }
    result = {"role": "tool", "tool_call_id": call["id"], "content": '{"ok": true}'}
    out = await client.chat.completions.create(model=fmt.model, messages=[*ASK, turn, result], tools=TOOLS, max_tokens=1)
    # The template renders the call with its arguments as an object, as Hugging Face templates expect.
    parsed_turn = turn | {"tool_calls": [{**turn["tool_calls"][0], "function": {"name": call["name"], "arguments": json.loads(call["arguments"])}}]}
    expected = _render(tok, template, [*ASK, parsed_turn, result])
    assert out.usage.prompt_tokens == expected
    text = tok.render_chat([*ASK, parsed_turn, result], tools=TOOLS, chat_template=template)
    assert call["name"] in text and '{"ok": true}' in text
    assert expected > _render(tok, template, ASK) + 10


def test_required_without_tools_is_a_400_and_auto_without_a_parser_too(server: str) -> None:
    r = httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": MODEL, "messages": ASK, "tool_choice": "required", "max_tokens": 2},
        timeout=120,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


# Issue 20's tool: an enum string, an integer range, an array of enum items with min/maxItems.
TRIP = {
    "type": "function",
    "function": {
        "name": "plan_trip",
        "parameters": {
            "type": "object",
            "properties": {
                "mode": {"type": "string", "enum": ["train", "bus", "car"]},
                "nights": {"type": "integer", "minimum": 1, "maximum": 14},
                "extras": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["breakfast", "parking", "wifi"]},
                    "minItems": 1,
                    "maxItems": 2,
                },
            },
            "required": ["mode", "nights", "extras"],
        },
    },
}


async def test_the_issue_tool_is_called_on_a_hermes_template(hermes_server: str) -> None:
    """Issue 20: tool_choice "required" with this tool on a Hermes-template model was a 400."""
    client = _client(hermes_server)
    out = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[TRIP], tool_choice="required", parallel_tool_calls=False, seed=0,
        max_tokens=300,
    )  # fmt: skip
    [call] = out.choices[0].message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), TRIP["function"]["parameters"])
    assert out.choices[0].finish_reason == "tool_calls"


async def test_forced_calls_on_a_template_without_tool_format_are_json_read_back(plain_server: str) -> None:
    """Issue 24, gap 7: "required" and a named function on a model whose template has no tool
    format, through the official client: the server constrains the call to JSON and reads it
    back into tool_calls, streamed and not; "auto" stays text."""
    client = _client(plain_server)
    named = {"type": "function", "function": {"name": "get_time"}}
    jobs = [_call(client, stream=i % 2 == 1, seed=i, tool_choice="required", max_tokens=600) for i in range(6)]
    jobs += [_call(client, stream=i % 2 == 1, seed=i, tool_choice=named, max_tokens=300) for i in range(4)]
    replies = await asyncio.gather(*jobs)
    for reply in replies[:6]:
        _check_calls(reply, {"get_weather", "get_time"})
        assert reply["content"] is None
    for reply in replies[6:]:
        _check_calls(reply, {"get_time"})
        assert reply["content"] is None and len(reply["calls"]) == 1
    auto = await _call(client, stream=False, seed=0, max_tokens=8)
    assert auto["calls"] == [] and auto["finish"] == "length" and auto["content"]
