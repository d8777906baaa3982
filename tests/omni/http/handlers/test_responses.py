"""The Responses routes on an app with a scripted pool: a turn is stored and read back, a
follow-up of an expired response is a 400 naming previous_response_id (a fake clock), and
unknown ids are OpenAI's 404s."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.engines.pool import ModelPool
from omni.http.app import add_routes
from omni.http.errors import error_middleware
from omni.http.state import MODELS, RESPONSES
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.responses.store import ResponseStore
from omni.text.tokenizer import TextTokenizer
from tests.omni.fake_pool import FakePool


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def client(tiny_tokenizer_dir: Path, clock: Clock) -> AsyncIterator[TestClient[Any, Any]]:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    pool = FakePool(tokenizer.encode(" ok", add_special_tokens=False))
    app = web.Application(middlewares=[error_middleware])
    app[MODELS] = ModelRegistry()
    app[MODELS].add(ServedModel("m", tokenizer, cast(ModelPool, pool), created=0))
    app[RESPONSES] = ResponseStore(ttl_s=60, clock=clock)
    add_routes(app)
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_a_stored_turn_is_read_back_and_expires(client: TestClient[Any, Any], clock: Clock) -> None:
    r = await client.post("/v1/responses", json={"model": "m", "input": "Hi", "metadata": {"k": "v"}})
    assert r.status == 200, await r.text()
    made = await r.json()
    assert made["status"] in ("completed", "incomplete") and made["metadata"] == {"k": "v"}
    assert made["output"][0]["type"] == "message"
    got = await client.get(f"/v1/responses/{made['id']}")
    assert got.status == 200 and await got.json() == made
    follow = await client.post("/v1/responses", json={"model": "m", "input": "More", "previous_response_id": made["id"]})
    assert follow.status == 200
    clock.now += 60
    late = await client.post("/v1/responses", json={"model": "m", "input": "More", "previous_response_id": made["id"]})
    assert late.status == 400 and (await late.json())["error"]["param"] == "previous_response_id"
    assert (await client.get(f"/v1/responses/{made['id']}")).status == 404


async def test_store_false_keeps_nothing(client: TestClient[Any, Any]) -> None:
    made = await (await client.post("/v1/responses", json={"model": "m", "input": "Hi", "store": False})).json()
    assert (await client.get(f"/v1/responses/{made['id']}")).status == 404


async def test_unknown_ids_are_404s_and_only_background_turns_cancel(client: TestClient[Any, Any]) -> None:
    for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/cancel")):
        r = await client.request(method, f"/v1/responses/resp_nope{path}")
        assert r.status == 404
        error = (await r.json())["error"]
        assert error["type"] == "invalid_request_error" and "resp_nope" in error["message"]
    made = await (await client.post("/v1/responses", json={"model": "m", "input": "Hi"})).json()
    r = await client.post(f"/v1/responses/{made['id']}/cancel")
    assert r.status == 400
    assert (await client.delete(f"/v1/responses/{made['id']}")).status == 200
    assert (await client.get(f"/v1/responses/{made['id']}")).status == 404
