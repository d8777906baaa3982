"""/tokenize, /detokenize, /version and /ping over HTTP, with a FakePool for the worker: the
token ids equal the tokenizer's (a chat's equal the ids a chat completion submits), and every
malformed body is a 400 naming its field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.engines.pool import ModelPool
from omni.http.app import add_routes
from omni.http.errors import error_middleware
from omni.http.handlers import system
from omni.http.state import MODELS
from omni.serving.model import ModelRegistry, ServedModel
from omni.text.tokenizer import TextTokenizer
from tests.omni.fake_pool import FakePool

HI = [{"role": "user", "content": "Hi there"}]


@dataclass
class ReadyPool(FakePool):
    ready: bool = False  # what /ping answers from (FakePool has no start)


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.fixture
def pool(tokenizer: TextTokenizer) -> ReadyPool:
    return ReadyPool(tokenizer.encode("ok", add_special_tokens=False))


def _app(tokenizer: TextTokenizer, pool: FakePool, names: tuple[str, ...] = ("m",)) -> web.Application:
    app = web.Application(middlewares=[error_middleware])
    app[MODELS] = ModelRegistry()
    for name in names:
        app[MODELS].add(ServedModel(name, tokenizer, cast(ModelPool, pool), created=0))
    add_routes(app)
    return app


@pytest.fixture
async def client(tokenizer: TextTokenizer, pool: FakePool) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(_app(tokenizer, pool))) as c:
        yield c


async def _post(client: TestClient[Any, Any], path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    r = await client.post(path, json=body)
    return r.status, await r.json()


async def test_a_prompt_is_the_tokenizers_ids(client: TestClient[Any, Any], tokenizer: TextTokenizer) -> None:
    status, body = await _post(client, "/tokenize", {"prompt": "Hello world"})
    ids = tokenizer.encode("Hello world")
    assert status == 200
    assert body == {"count": len(ids), "max_model_len": 256, "tokens": ids, "token_strs": None}
    _, plain = await _post(client, "/tokenize", {"model": "m", "prompt": "Hello world", "add_special_tokens": False})
    assert plain["tokens"] == tokenizer.encode("Hello world", add_special_tokens=False)


async def test_token_strs_are_the_vocabulary_entries(client: TestClient[Any, Any], tokenizer: TextTokenizer) -> None:
    _, body = await _post(client, "/tokenize", {"prompt": "Hello world", "return_token_strs": True})
    assert body["token_strs"] == [tokenizer.backend.id_to_token(t) for t in body["tokens"]]


async def test_messages_are_the_ids_a_chat_completion_submits(
    client: TestClient[Any, Any], pool: FakePool, tokenizer: TextTokenizer
) -> None:
    for extra in ({}, {"add_generation_prompt": False}):
        status, body = await _post(client, "/tokenize", {"messages": HI, **extra})
        assert status == 200
        r = await client.post("/v1/chat/completions", json={"model": "m", "messages": HI, "max_tokens": 1, **extra})
        assert r.status == 200
        assert body["tokens"] == pool.submitted[-1].prompt_token_ids
        assert body["count"] == (await r.json())["usage"]["prompt_tokens"]
    assert body["tokens"] == tokenizer.apply_chat_template(HI, add_generation_prompt=False)


async def test_detokenize_round_trips(client: TestClient[Any, Any], tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode("Hello world", add_special_tokens=False)
    status, body = await _post(client, "/detokenize", {"tokens": ids})
    assert (status, body) == (200, {"prompt": "Hello world"})


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/detokenize", {"tokens": [1, "2"]}, "tokens"),
        ("/detokenize", {"tokens": [True]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {}, "tokens"),
        ("/detokenize", {"tokens": [1], "prompt": "x"}, "prompt"),
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": HI}, "prompt"),
        ("/tokenize", {"prompt": "a", "tools": []}, "tools"),
        ("/tokenize", {"messages": HI, "temperature": 1}, "temperature"),
        ("/tokenize", {"messages": HI, "add_special_tokens": True}, "add_special_tokens"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/tokenize", {"messages": HI, "add_generation_prompt": True, "continue_final_message": True}, "continue_final_message"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
            "messages[0].content[0]",
        ),
    ],
)
async def test_a_malformed_body_is_a_400_naming_its_field(
    client: TestClient[Any, Any], path: str, body: dict[str, Any], param: str
) -> None:
    status, out = await _post(client, path, body)
    assert (status, out["error"]["param"]) == (400, param), out


async def test_the_model_is_optional_only_when_one_is_served(tokenizer: TextTokenizer, pool: FakePool) -> None:
    async with TestClient(TestServer(_app(tokenizer, pool, ("a", "b")))) as c:
        status, out = await _post(c, "/tokenize", {"prompt": "x"})
        assert (status, out["error"]["param"]) == (400, "model")
        status, out = await _post(c, "/tokenize", {"model": "b", "prompt": "x"})
        assert status == 200
        status, out = await _post(c, "/detokenize", {"model": "c", "tokens": [1]})
        assert (status, out["error"]["code"]) == (404, "model_not_found")


async def test_version_and_ping(client: TestClient[Any, Any], pool: ReadyPool) -> None:
    r = await client.get("/version")
    assert r.status == 200 and (await r.json())["version"] == system.package_version()
    for method in ("GET", "POST"):
        r = await client.request(method, "/ping")
        assert r.status == 503  # as /health answers while a model starts
        pool.ready = True
        r = await client.request(method, "/ping")
        assert (r.status, await r.json()) == (200, {"status": "ok"})
        pool.ready = False
