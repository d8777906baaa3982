"""POST /v1/chat/completions over HTTP, with a FakePool for the workers: the handler reads the
body, runs the lifecycle (tests/omni/serving/test_chat.py), and writes the body or the
SSE chunks; what the lifecycle refuses is an OpenAI error object with its status."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.engines.pool import ModelPool
from omni.http.errors import error_middleware
from omni.http.handlers import chat
from omni.http.state import MODELS
from omni.serving.model import ModelRegistry, ServedModel
from omni.text.tokenizer import TextTokenizer
from tests.omni.fake_pool import FakePool

PNG_URL = "data:image/png;base64,iVBORw0KGgo="
REPLY = "Hello there"
USER_HI = {"role": "user", "content": "Hi"}


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.fixture
def pool(tokenizer: TextTokenizer) -> FakePool:
    return FakePool(tokenizer.encode(REPLY, add_special_tokens=False))


@pytest.fixture
async def client(tokenizer: TextTokenizer, pool: FakePool) -> AsyncIterator[TestClient[Any, Any]]:
    app = web.Application(middlewares=[error_middleware])
    app[MODELS] = ModelRegistry()
    app[MODELS].add(ServedModel("m", tokenizer, cast(ModelPool, pool), created=0))
    app.router.add_post("/v1/chat/completions", chat.create_chat_completion)
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_chat_submits_one_request_per_choice_and_assembles_the_body(
    client: TestClient[Any, Any], pool: FakePool, tokenizer: TextTokenizer
) -> None:
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": [USER_HI], "n": 2})
    assert r.status == 200
    body = await r.json()
    prompt = tokenizer.apply_chat_template([USER_HI])
    assert [req.request_id for req in pool.submitted] == [f"{body['id']}-0", f"{body['id']}-1"]
    assert all(req.prompt_token_ids == prompt for req in pool.submitted)
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert [(c["index"], c["message"], c["finish_reason"]) for c in body["choices"]] == [
        (i, {"role": "assistant", "content": REPLY}, "length") for i in range(2)
    ]
    n = len(pool.tokens)
    assert body["usage"] == {  # the shared prompt counted once
        "prompt_tokens": len(prompt),
        "completion_tokens": 2 * n,
        "total_tokens": len(prompt) + 2 * n,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_chat_stream_sends_the_role_then_the_text_then_done(
    client: TestClient[Any, Any], pool: FakePool
) -> None:
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": [USER_HI], "stream": True})
    assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
    events = [e.removeprefix("data: ") for e in (await r.text()).split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:]) == REPLY
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert pool.aborted == []  # finished by the worker: nothing to abort


async def test_chat_while_starting_is_a_503_before_media_is_looked_at(
    client: TestClient[Any, Any], pool: FakePool
) -> None:
    pool.serving = False
    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    messages = [{"role": "user", "content": [image]}]
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    assert (r.status, r.headers["Retry-After"]) == (503, "5")
    assert pool.submitted == []


async def test_chat_media_on_a_text_only_model_is_a_400_naming_the_part(
    client: TestClient[Any, Any], pool: FakePool
) -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "Look"}, audio]}]
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    error = (await r.json())["error"]
    assert (r.status, error["param"]) == (400, "messages[0].content[1]")
    assert error["code"] == "unsupported_content_type"
    assert pool.submitted == []


async def test_an_unknown_model_is_a_404(client: TestClient[Any, Any]) -> None:
    r = await client.post("/v1/chat/completions", json={"model": "nope", "messages": [USER_HI]})
    assert (r.status, (await r.json())["error"]["code"]) == (404, "model_not_found")


async def test_a_bad_deadline_header_is_a_400_before_the_model_is_looked_up(client: TestClient[Any, Any]) -> None:
    r = await client.post(
        "/v1/chat/completions", json={"model": "nope", "messages": [USER_HI]}, headers={"X-Request-Timeout": "soon"}
    )
    assert (r.status, (await r.json())["error"]["code"]) == (400, "invalid_header")
