"""Reasoning through the real server: <think>...</think> goes to reasoning_content, the rest to
content, equal whether streamed or not; thinking_token_budget ends the reasoning; chat template
kwargs and reasoning_effort reach the template."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from omni.text.tokenizer import TextTokenizer

MODEL = "omni-tiny"
ASK = [{"role": "user", "content": "Think first, then answer."}]
# A template whose generation prompt opens <think> (Qwen3 / R1 style): the model starts reasoning.
THINK_OPEN = (Path(__file__).resolve().parent / "templates" / "think_open.jinja").read_text()


def _client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)


async def _reply(client: openai.AsyncOpenAI, stream: bool, **fields: Any) -> tuple[str | None, str, str]:
    """(reasoning_content, content, finish_reason)."""
    kw: dict[str, Any] = dict(model=MODEL, messages=ASK, temperature=1.0, max_tokens=24) | fields
    if not stream:
        out = await client.chat.completions.create(**kw)
        message = out.choices[0].message
        # vLLM's newer name carries the same text (clients read either)
        assert getattr(message, "reasoning", None) == getattr(message, "reasoning_content", None)
        return getattr(message, "reasoning_content", None), message.content or "", out.choices[0].finish_reason
    reasoning, content, finish, saw_reasoning = "", "", "", False
    async for chunk in await client.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            assert delta.get("reasoning") == delta.get("reasoning_content")
            if delta.get("reasoning_content"):
                saw_reasoning = True
                reasoning += delta["reasoning_content"]
            content += delta.get("content") or ""
            finish = choice.finish_reason or finish
    return (reasoning if saw_reasoning else None), content, finish


async def test_the_budget_ends_reasoning_and_both_modes_agree(server: str) -> None:
    client = _client(server)
    extra = {"chat_template": THINK_OPEN, "thinking_token_budget": 6}
    for seed in range(4):
        whole, streamed = await asyncio.gather(
            _reply(client, False, seed=seed, extra_body=extra), _reply(client, True, seed=seed, extra_body=extra)
        )
        assert whole == streamed
        reasoning, content, finish = whole
        assert reasoning and content and finish == "length"
        for part in (reasoning, content):
            assert "<think>" not in part and "</think>" not in part


async def test_without_an_end_everything_is_reasoning(server: str) -> None:
    client = _client(server)
    for stream in (False, True):
        reasoning, content, _ = await _reply(client, stream, seed=1, max_tokens=6, extra_body={"chat_template": THINK_OPEN})
        assert reasoning and content == ""


async def test_an_answer_format_holds_from_the_end_of_reasoning(server: str) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    client = _client(server)
    for stream in (False, True):
        extra = {"chat_template": THINK_OPEN, "thinking_token_budget": 4}
        reasoning, content, finish = await _reply(
            client, stream, seed=3, max_tokens=60, response_format=fmt, extra_body=extra
        )
        assert reasoning and finish == "stop"
        jsonschema.validate(json.loads(content), schema)


async def test_template_kwargs_reach_the_template(server: str, tiny_model_dir: Path) -> None:
    """The reference template's skip_reasoning ends the prompt with an empty, closed block."""
    tok = TextTokenizer.from_dir(tiny_model_dir)
    client = _client(server)
    plain = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    skip = await client.chat.completions.create(
        # greedy: a sampled first token may be <think>, which the parser would open a block on
        model=MODEL, messages=ASK, max_tokens=1, temperature=0,
        extra_body={"chat_template_kwargs": {"skip_reasoning": True}},
    )
    block = tok.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    assert skip.usage.prompt_tokens == plain.usage.prompt_tokens + len(block)
    assert getattr(skip.choices[0].message, "reasoning_content", "missing") is None


async def test_reasoning_effort_none_or_minimal_skips_the_block_as_the_responses_api_does(
    server: str, tiny_model_dir: Path
) -> None:
    """The openai client's reasoning_effort: none and minimal end the prompt with the empty,
    closed block (as skip_reasoning does, and the Responses API's reasoning.effort), the others
    leave the prompt as it is; a value OpenAI does not know is a 400 naming the field."""
    tok = TextTokenizer.from_dir(tiny_model_dir)
    client = _client(server)
    plain = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    block = len(tok.encode("<think>\n\n</think>\n\n", add_special_tokens=False))
    for effort in ("none", "minimal", "low", "medium", "high"):
        out = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1, reasoning_effort=effort)
        skip = effort in ("none", "minimal")
        assert out.usage.prompt_tokens == plain.usage.prompt_tokens + (block if skip else 0), effort
    responses = await client.responses.create(model=MODEL, input=ASK[0]["content"], max_output_tokens=16, reasoning={"effort": "none"})
    skipped = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1, reasoning_effort="none")
    assert responses.usage.input_tokens == skipped.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1, reasoning_effort="extreme")  # type: ignore[arg-type]
    assert (e.value.status_code, e.value.param, e.value.code) == (400, "reasoning_effort", "invalid_value")


def test_completions_honour_the_budget_too(server: str) -> None:
    import httpx

    body = {
        "model": MODEL,
        "prompt": "Question: why?<think>\n",
        "max_tokens": 8,
        "seed": 0,
        "logprobs": 0,
        "skip_special_tokens": False,
        "thinking_token_budget": 3,
    }
    out = httpx.post(f"{server}/v1/completions", json=body, timeout=120).json()
    tokens = out["choices"][0]["logprobs"]["tokens"]
    assert tokens[3] == "</think>" and "</think>" not in tokens[:3]  # three of reasoning, then its end
    del body["thinking_token_budget"]
    free = httpx.post(f"{server}/v1/completions", json=body, timeout=120).json()
    assert free["choices"][0]["logprobs"]["tokens"][3] != "</think>"
