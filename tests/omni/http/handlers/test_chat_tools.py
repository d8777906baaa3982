"""Forced tool calls through POST /v1/chat/completions, with a SamplingPool for the workers (it
samples uniformly among the tokens each choice's grammar allows: the weakest model there is),
so the body, the grammar, the parsers and the response are the server's own:

- issue 20, acceptance 6: the issue's body (tool_choice "required", a tool with an enum
  string, an integer range and an array of enum items with min/maxItems) on a Hermes-template
  model was a 400 "Invalid grammar in 'tool_choice'"; it returns a call that validates.
- issue 24, gap 7: on a model whose template has no tool format (SmolLM2's shape), "required"
  and a named function are JSON the server reads back into tool_calls (content null,
  finish_reason "tool_calls"), streamed and not; the template still gets the tools; "auto"
  stays plain text."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import jsonschema
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.engines.pool import ModelPool
from omni.http.errors import error_middleware
from omni.http.handlers import chat
from omni.http.state import MODELS
from omni.serving.model import ModelRegistry, ServedModel
from omni.text.chat_format import ChatFormat
from omni.text.tokenizer import TextTokenizer
from tests.omni.fake_pool import SamplingPool

TEMPLATES = Path(__file__).resolve().parents[3] / "e2e" / "templates"
REPLY = "Hello there"
ASK = [{"role": "user", "content": "Plan a trip to Busan for me."}]
TRIP = {
    "type": "object",
    "properties": {
        "mode": {"type": "string", "enum": ["train", "bus", "car"], "description": "How to travel"},
        "nights": {"type": "integer", "minimum": 1, "maximum": 14},
        "extras": {
            "type": "array",
            "items": {"type": "string", "enum": ["breakfast", "parking", "wifi"]},
            "minItems": 1,
            "maxItems": 2,
        },
    },
    "required": ["mode", "nights", "extras"],
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
}
TOOLS = [
    {"type": "function", "function": {"name": "plan_trip", "description": "Plan a trip", "parameters": TRIP}},
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
]
SCHEMAS = {"plan_trip": TRIP, "get_weather": WEATHER}
# The issue's body: the first tool alone, its call required.
ISSUE_BODY = {"messages": ASK, "tools": TOOLS[:1], "tool_choice": "required"}


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.fixture
def pool(tokenizer: TextTokenizer) -> SamplingPool:
    eos = frozenset(tokenizer.eos_token_ids)
    return SamplingPool(tokenizer.encode(REPLY, add_special_tokens=False), max_model_len=4096, eos_token_ids=eos)


@pytest.fixture
async def client(tokenizer: TextTokenizer, pool: SamplingPool) -> AsyncIterator[TestClient[Any, Any]]:
    """Two models on the tiny tokenizer: "hermes" with the tests' Hermes template, "plain" with
    a template that has no tool format."""
    app = web.Application(middlewares=[error_middleware])
    app[MODELS] = ModelRegistry()
    for name, template in (("hermes", "hermes.jinja"), ("plain", "plain_tools.jinja")):
        fmt = ChatFormat.resolve(tokenizer, chat_template=(TEMPLATES / template).read_text())
        app[MODELS].add(ServedModel(name, tokenizer, cast(ModelPool, pool), created=0, chat_format=fmt))
    app.router.add_post("/v1/chat/completions", chat.create_chat_completion)
    async with TestClient(TestServer(app)) as c:
        yield c


async def reply(client: TestClient[Any, Any], **body: Any) -> dict[str, Any]:
    """The first choice as {content, finish, calls}, streamed deltas joined."""
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 200, await r.text()
    if not body.get("stream"):
        choice = (await r.json())["choices"][0]
        calls = [
            {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in choice["message"].get("tool_calls") or []
        ]
        return {"content": choice["message"]["content"], "finish": choice["finish_reason"], "calls": calls}
    content, finish, calls = "", None, {}
    for event in (await r.text()).split("\n\n"):
        if not event or event == "data: [DONE]":
            continue
        for choice in orjson.loads(event.removeprefix("data: "))["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            finish = choice["finish_reason"] or finish
            for d in delta.get("tool_calls") or []:
                call = calls.setdefault(d["index"], {"id": None, "name": None, "arguments": ""})
                call["id"] = call["id"] or d.get("id")
                call["name"] = call["name"] or d["function"].get("name")
                call["arguments"] += d["function"].get("arguments") or ""
    return {"content": content or None, "finish": finish, "calls": [calls[i] for i in sorted(calls)]}


def check_calls(out: dict[str, Any], names: set[str]) -> None:
    assert out["finish"] == "tool_calls" and out["content"] is None and out["calls"], out
    for call in out["calls"]:
        assert call["id"].startswith("call_") and call["name"] in names, out
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_issue_body_on_a_hermes_template_returns_a_valid_call(client: TestClient[Any, Any], stream: bool) -> None:
    for seed in range(4):
        out = await reply(client, model="hermes", seed=seed, stream=stream, **ISSUE_BODY)
        check_calls(out, {"plan_trip"})


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_required_on_a_template_without_tool_format_is_json_read_back(
    client: TestClient[Any, Any], pool: SamplingPool, tokenizer: TextTokenizer, stream: bool
) -> None:
    arguments = set()
    for seed in range(6):
        out = await reply(client, model="plain", messages=ASK, tools=TOOLS, tool_choice="required", seed=seed, stream=stream)
        check_calls(out, {"plan_trip", "get_weather"})
        arguments.add(out["calls"][0]["arguments"])
    assert len(arguments) > 1  # sampled, and the grammar makes each one valid
    prompt = tokenizer.decode(pool.submitted[-1].prompt_token_ids, skip_special_tokens=False)
    assert '"name": "plan_trip"' in prompt and '"name": "get_weather"' in prompt  # the template got the tools


async def test_without_parallel_calls_required_makes_one(client: TestClient[Any, Any]) -> None:
    for seed in range(4):
        out = await reply(
            client, model="plain", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=seed
        )
        check_calls(out, {"plan_trip", "get_weather"})
        assert len(out["calls"]) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_named_function_on_a_template_without_tool_format_is_its_arguments(
    client: TestClient[Any, Any], stream: bool
) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(4):
        out = await reply(client, model="plain", messages=ASK, tools=TOOLS, tool_choice=named, seed=seed, stream=stream)
        check_calls(out, {"get_weather"})
        assert len(out["calls"]) == 1


async def test_auto_on_a_template_without_tool_format_stays_text(client: TestClient[Any, Any]) -> None:
    out = await reply(client, model="plain", messages=ASK, tools=TOOLS, max_tokens=8)
    assert out == {"content": REPLY, "finish": "length", "calls": []}


async def test_a_forced_json_call_cut_by_max_tokens_is_a_call_with_what_it_wrote(client: TestClient[Any, Any]) -> None:
    named = {"type": "function", "function": {"name": "plan_trip"}}
    for choice, max_tokens in (("required", 24), (named, 4)):
        whole = await reply(client, model="plain", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=max_tokens, seed=1)
        streamed = await reply(
            client, model="plain", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=max_tokens, seed=1, stream=True
        )
        for out in (whole, streamed):
            assert out["finish"] == "length" and out["content"] is None, out
        assert [(c["name"], c["arguments"]) for c in whole["calls"]] == [(c["name"], c["arguments"]) for c in streamed["calls"]]
        assert whole["calls"], whole
