"""Structured output through the real server: the tiny model has random weights, so only the
grammar can make its output valid. Requests run concurrently, so masks are batched in steps.
The chat tests run on both served dialects (conftest.Dialect)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.conftest import Dialect

MODEL = "omni-tiny"
ASK = [{"role": "user", "content": "Answer in the format asked for."}]

SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}, "name": {"type": "string", "maxLength": 8}},
                "required": ["id", "name"],
                "additionalProperties": False,
            },
            "ok": {"type": "boolean"},
        },
        "required": ["user", "ok"],
        "additionalProperties": False,
    },
    "bounded_array": {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 2, "maxItems": 4}},
        "required": ["xs"],
        "additionalProperties": False,
    },
    "enums": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L", 42]}},
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    "ranges": {
        "type": "object",
        "properties": {"year": {"type": "integer", "minimum": 1900, "maximum": 2100}, "score": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}},
        "required": ["year", "score"],
        "additionalProperties": False,
    },
    "optional": {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "string", "maxLength": 3}, "c": {"type": "null"}},
        "required": ["a"],
        "additionalProperties": False,
    },
}


async def _chat(client: openai.AsyncOpenAI, stream: bool, seed: int, **fields: Any) -> tuple[str, str]:
    kw: dict[str, Any] = dict(model=MODEL, messages=ASK, temperature=1.0, seed=seed) | {"max_tokens": 200, **fields}
    if not stream:
        out = await client.chat.completions.create(**kw)
        return out.choices[0].message.content or "", out.choices[0].finish_reason
    text, finish = "", ""
    async for chunk in await client.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def _client(server: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=120)


async def test_fifty_json_schema_requests_all_validate(dialect: Dialect) -> None:
    client = _client(dialect.base)
    on = {"model": dialect.model, "extra_body": dialect.chat}
    jobs = []
    for s, (name, schema) in enumerate(SCHEMAS.items()):
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
        jobs += [(name, _chat(client, stream=i % 2 == 1, seed=100 * s + i, response_format=fmt, **on)) for i in range(10)]
    results = await asyncio.gather(*(job for _, job in jobs))
    assert len(results) == 50
    for (name, _), (text, finish) in zip(jobs, results):
        jsonschema.validate(json.loads(text), SCHEMAS[name])
        assert finish == "stop", (name, text)
    # seeded sampling varies: the grammar, not a fixed answer, makes them valid
    assert len({text for text, _ in results}) > 25


async def test_regex_and_choice_and_vllm_field_names(dialect: Dialect) -> None:
    client = _client(dialect.base)
    regex = r"[0-9]{3}-[a-z]{2,4}"
    choices = ["yes", "no", "maybe later"]
    regexed, chosen = dialect.chat | {"structured_outputs": {"regex": regex}}, dialect.chat | {"guided_choice": choices}
    jobs = [_chat(client, stream=i % 2 == 1, seed=i, model=dialect.model, extra_body=regexed) for i in range(10)]
    jobs += [_chat(client, stream=i % 2 == 1, seed=i, model=dialect.model, extra_body=chosen) for i in range(10)]
    results = await asyncio.gather(*jobs)
    for text, finish in results[:10]:
        assert re.fullmatch(regex, text) and finish == "stop", text
    for text, finish in results[10:]:
        assert text in choices and finish == "stop", text


def test_completions_take_guided_json_too(server: str) -> None:
    schema = SCHEMAS["enums"]
    out = httpx.post(
        f"{server}/v1/completions",
        json={"model": MODEL, "prompt": "JSON:", "max_tokens": 100, "seed": 1, "temperature": 1.0, "guided_json": schema},
        timeout=120,
    ).json()
    jsonschema.validate(json.loads(out["choices"][0]["text"]), schema)
    assert out["choices"][0]["finish_reason"] == "stop"


def test_a_schema_that_does_not_compile_is_a_400_and_the_server_goes_on(server: str) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/definitions/none"}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, response_format=bad, max_tokens=5)
    assert e.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]
    assert e.value.body["code"] == "invalid_grammar"  # type: ignore[index]
    assert "does not exist" in e.value.body["message"]  # type: ignore[index]
    # ignore_eos: the random model may draw its end token within 3; the server must answer in full
    ok = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3, extra_body={"ignore_eos": True})
    assert ok.choices[0].finish_reason == "length"


async def test_fifty_json_object_requests_all_parse(dialect: Dialect) -> None:
    """Any JSON object has no length bound: what keeps a random model's answer parseable is the
    closer, which ends the object within max_tokens (finish_reason "length" when it had to)."""
    client = _client(dialect.base)
    fmt = {"type": "json_object"}
    on = {"model": dialect.model, "extra_body": dialect.chat}
    jobs = [_chat(client, stream=i % 2 == 1, seed=i, response_format=fmt, max_tokens=40 + i, **on) for i in range(50)]
    results = await asyncio.gather(*jobs)
    finishes = []
    for text, finish in results:
        assert isinstance(json.loads(text), dict), text
        finishes.append(finish)
    assert set(finishes) <= {"stop", "length"} and len({t for t, _ in results}) > 25



# The published layout (bin/omni-serve's default, the speaking_server fixture): its dialect opens
# <think> unless told otherwise, so an answer format holds from the end of the reasoning, and
# the model draws and speaks. Random weights: at temperature 1 and 600 tokens, seeds 9 to 16
# drew an image (9, 11, 13) or spoke (10, 13, 15) inside the reasoning, or ended the turn there
# (14, 16), before the answer format held the reasoning to none of it.
PUBLISHED = "omni"
ANSWER_SEEDS = range(9, 17)
DIGIT = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a"],
    "additionalProperties": False,
}
ANSWER_FORMATS = {
    "json_schema": {"type": "json_schema", "json_schema": {"name": "digit", "schema": DIGIT}},
    "json_object": {"type": "json_object"},
}


def _answer(content: str, kind: str) -> None:
    if kind == "json_schema":
        jsonschema.validate(json.loads(content), DIGIT)
    else:
        assert isinstance(json.loads(content), dict), content


@pytest.fixture(scope="module", params=list(ANSWER_FORMATS))
def formatted_turns(request: pytest.FixtureRequest, speaking_server: str) -> tuple[str, list[dict[str, Any]]]:
    """Each seed's choice of a turn with an answer format and no modalities, on the published
    layout: (the format, the choices)."""
    kind = request.param
    choices = []
    for seed in ANSWER_SEEDS:
        body = {
            "model": PUBLISHED, "messages": [{"role": "user", "content": "Answer in JSON."}],
            "response_format": ANSWER_FORMATS[kind], "seed": seed, "temperature": 1.0, "max_tokens": 600,
        }  # fmt: skip
        out = httpx.post(f"{speaking_server}/v1/chat/completions", json=body, timeout=300).json()
        choices.append(out["choices"][0] | {"seed": seed})
    return kind, choices


def test_an_answer_format_draws_no_image_in_the_reasoning(formatted_turns: tuple[str, list[dict[str, Any]]]) -> None:
    """content is the format's text, never parts with an image drawn before the answer."""
    _, choices = formatted_turns
    for c in choices:
        assert c["message"]["reasoning_content"], c["seed"]  # the template opened the reasoning
        assert isinstance(c["message"]["content"], str), (c["seed"], c["message"]["content"])


def test_an_answer_format_turn_ends_with_its_answer(formatted_turns: tuple[str, list[dict[str, Any]]]) -> None:
    """The reasoning may not end the turn: a "stop" turn's content is the whole answer; a turn
    whose reasoning never ends runs to its length."""
    kind, choices = formatted_turns
    for c in choices:
        if c["finish_reason"] == "stop":
            _answer(c["message"]["content"], kind)
        else:
            assert c["finish_reason"] == "length", c["seed"]
    assert any(c["finish_reason"] == "stop" for c in choices)


def test_an_answer_format_speaks_only_when_modalities_asks(formatted_turns: tuple[str, list[dict[str, Any]]]) -> None:
    """No modalities given: no audio, as OpenAI answers (the reference dialect's bare units in
    the reasoning are not spoken)."""
    _, choices = formatted_turns
    assert [c["seed"] for c in choices if c["message"].get("audio") is not None] == []


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_format_comes_once_the_reasoning_ends(speaking_server: str, stream: bool) -> None:
    """With a thinking budget the reasoning ends in time, and every turn's content is the JSON
    alone, streamed or not: no image part, no audio, no empty answer."""
    client = openai.OpenAI(base_url=f"{speaking_server}/v1", api_key="none", max_retries=0, timeout=300)
    for seed in range(9, 13):
        kw: dict[str, Any] = dict(
            model=PUBLISHED, messages=[{"role": "user", "content": "Answer in JSON."}], seed=seed, temperature=1.0,
            max_tokens=300, response_format=ANSWER_FORMATS["json_schema"], extra_body={"thinking_token_budget": 40},
        )  # fmt: skip
        if not stream:
            out = client.chat.completions.create(**kw)
            message = out.choices[0].message
            assert message.audio is None and isinstance(message.content, str), (seed, message)
            assert out.choices[0].finish_reason == "stop", seed
            _answer(message.content, "json_schema")
            continue
        text, finish = "", None
        for chunk in client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                delta = c.delta.model_dump()
                assert delta.get("audio") is None, seed
                assert delta.get("content") is None or isinstance(delta["content"], str), (seed, delta)
                text += delta.get("content") or ""
                finish = c.finish_reason or finish
        assert finish == "stop", seed
        _answer(text, "json_schema")
