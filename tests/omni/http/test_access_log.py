"""Request ids on every response (the client's when usable, else fresh), and the access line."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.engines.generation import Usage
from omni.errors import bad_request
from omni.http.access_log import AccessLogger, add_request_id_header, note_generation, request_id, request_id_middleware
from omni.http.errors import error_middleware


@dataclass
class FakeChoice:
    usage: Usage
    first_token_time: float | None


async def ok(request: web.Request) -> web.Response:
    note_generation(request, "m", [FakeChoice(Usage(7, 3), None), FakeChoice(Usage(7, 2), None)])
    return web.json_response({"id": request_id(request)})


async def refused(request: web.Request) -> web.Response:
    raise bad_request("no", param="x")


async def streamed(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"data: 1\n\n")
    return response


@pytest.fixture
async def client() -> TestClient:
    app = web.Application(middlewares=[request_id_middleware, error_middleware])
    app.on_response_prepare.append(add_request_id_header)
    app.router.add_get("/ok", ok)
    app.router.add_get("/refused", refused)
    app.router.add_get("/streamed", streamed)
    app.router.add_get("/health", streamed)
    server = TestServer(app)
    await server.start_server(access_log_class=AccessLogger, access_log=logging.getLogger("omni.access"))
    async with TestClient(server) as c:
        yield c


async def test_the_clients_id_comes_back_on_every_response(client: TestClient) -> None:
    for path, status in (("/ok", 200), ("/refused", 400), ("/streamed", 200), ("/nowhere", 404)):
        r = await client.get(path, headers={"X-Request-Id": "client-id-42"})
        assert r.status == status
        assert r.headers["X-Request-Id"] == "client-id-42"
    r = await client.get("/ok", headers={"X-Request-Id": "client-id-42"})
    assert (await r.json())["id"] == "client-id-42"  # and handlers see it


@pytest.mark.parametrize("given", [None, "", "has spaces", "x" * 129, "é"])
async def test_an_unusable_or_missing_id_is_replaced(client: TestClient, given: str | None) -> None:
    headers = {} if given is None else {"X-Request-Id": given}
    r = await client.get("/ok", headers=headers)
    rid = r.headers["X-Request-Id"]
    assert rid != given and len(rid) == 32 and int(rid, 16) >= 0
    assert (await client.get("/ok")).headers["X-Request-Id"] != rid  # fresh each time


async def test_one_access_line_per_request(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="omni.access"):
        await client.get("/ok", headers={"X-Request-Id": "abc"})
        await client.get("/refused", headers={"X-Request-Id": "def"})
        await client.get("/health")  # a probe: a debug line
        async def written() -> None:  # the line is written once the response is out, after the client has it
            while sum(r.name == "omni.access" for r in caplog.records) < 2:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(written(), 120)  # a hang guard, not a timing
    lines = [r.getMessage() for r in caplog.records if r.name == "omni.access" and r.levelno == logging.INFO]
    assert len(lines) == 2
    assert lines[0].startswith("GET /ok 200 model=m prompt_tokens=7 output_tokens=5 ")
    assert "latency_ms=" in lines[0] and lines[0].endswith("request_id=abc")
    assert lines[1].startswith("GET /refused 400 latency_ms=") and lines[1].endswith("request_id=def")
