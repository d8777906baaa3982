"""CORS on the real app (create_app with a policy, no models, an API key set) plus a
streamed and a failing toy route: preflights answered before auth, responses marked for
allowed origins only, errors and streams included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.config import CorsPolicy, ServerConfig, StoreConfig
from omni.http.app import create_app
from omni.http.sse import open_event_stream, send_done, send_event

KEY = "sk-test"
PAGE = "http://127.0.0.1:9000"
OTHER = "http://127.0.0.1:9001"
CHAT = "/v1/chat/completions"
AUTH = {"Authorization": f"Bearer {KEY}"}


async def streamed(request: web.Request) -> web.StreamResponse:
    response = await open_event_stream(request)  # prepared here, before any middleware returns
    await send_event(response, {"n": 1})
    await send_done(response)
    return response


async def broken(request: web.Request) -> web.StreamResponse:
    raise RuntimeError("boom")


Client = TestClient[Any, Any]


async def _client(policy: CorsPolicy, tmp_path: Path) -> Client:
    app = create_app(ServerConfig(api_key=KEY, store=StoreConfig(f"local:{tmp_path}"), cors=policy))
    app.router.add_get("/toy/stream", streamed)
    app.router.add_get("/toy/broken", broken)
    client: Client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    c = await _client(CorsPolicy(origins=(PAGE,)), tmp_path)
    try:
        yield c
    finally:
        await c.close()


def _preflight(origin: str, method: str = "POST", headers: str | None = "authorization, content-type") -> dict[
    str, str
]:
    out = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers is not None:
        out["Access-Control-Request-Headers"] = headers
    return out


def _vary(r: Any) -> set[str]:
    return {v.strip().lower() for v in r.headers.get("Vary", "").split(",") if v.strip()}


async def test_a_preflight_from_an_allowed_origin_passes_without_the_key(client: Client) -> None:
    r = await client.options(CHAT, headers={**_preflight(PAGE), "X-Request-Id": "pre-1"})
    assert r.status == 204
    assert r.headers["Access-Control-Allow-Origin"] == PAGE
    assert r.headers["Access-Control-Allow-Methods"] == "POST"
    assert r.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    assert r.headers["Access-Control-Max-Age"] == "600"
    assert "Access-Control-Allow-Credentials" not in r.headers
    assert "origin" in _vary(r)
    assert r.headers["X-Request-Id"] == "pre-1"  # the preflight is a response like any other
    assert await r.read() == b""


async def test_a_preflight_is_answered_for_any_path(client: Client) -> None:
    for path in ("/v1/models", "/no/such/route", "/health"):
        r = await client.options(path, headers=_preflight(PAGE, "GET", None))
        assert r.status == 204, path
        assert r.headers["Access-Control-Allow-Origin"] == PAGE
        assert "Access-Control-Allow-Headers" not in r.headers  # none were asked for


async def test_a_preflight_from_another_origin_is_refused(client: Client) -> None:
    r = await client.options(CHAT, headers=_preflight(OTHER))
    assert r.status == 403
    assert not [h for h in r.headers if h.lower().startswith("access-control-")]
    body = await r.json()
    assert body["error"]["code"] == "cors_forbidden" and OTHER in body["error"]["message"]


async def test_options_without_cors_headers_is_unchanged(client: Client) -> None:
    assert (await client.options(CHAT)).status == 401  # the key is checked first, as without CORS
    assert (await client.options(CHAT, headers=AUTH)).status == 405
    # Origin alone is no preflight either: routed as any OPTIONS, and marked as any response
    r = await client.options(CHAT, headers={"Origin": PAGE, **AUTH})
    assert r.status == 405
    assert r.headers["Access-Control-Allow-Origin"] == PAGE


async def test_an_allowed_origins_responses_are_marked(client: Client) -> None:
    r = await client.get("/v1/models", headers={"Origin": PAGE, **AUTH, "X-Request-Id": "abc"})
    assert r.status == 200
    assert r.headers["Access-Control-Allow-Origin"] == PAGE
    exposed = {h.strip().lower() for h in r.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"x-request-id", "retry-after"} <= exposed
    assert "origin" in _vary(r)
    assert r.headers["X-Request-Id"] == "abc"


async def test_other_origins_and_plain_clients_get_no_cors_headers(client: Client) -> None:
    for headers in ({"Origin": OTHER, **AUTH}, AUTH):
        r = await client.get("/v1/models", headers=headers)
        assert r.status == 200
        assert not [h for h in r.headers if h.lower().startswith("access-control-")]
        assert "origin" in _vary(r)  # a cache must not serve one origin's answer to another


async def test_error_responses_are_marked(client: Client) -> None:
    cases = [
        ("POST", CHAT, {}, 401),  # the key is missing: the page must be able to read why
        ("GET", "/no/such/route", AUTH, 404),
        ("POST", CHAT, AUTH, 400),  # no body
        ("GET", "/toy/broken", AUTH, 500),
    ]
    for method, path, headers, status in cases:
        r = await client.request(method, path, headers={"Origin": PAGE, **headers})
        assert r.status == status, path
        assert r.headers["Access-Control-Allow-Origin"] == PAGE, path
        assert (await r.json())["error"]["message"]


async def test_a_streamed_response_is_marked(client: Client) -> None:
    r = await client.get("/toy/stream", headers={"Origin": PAGE, **AUTH})
    assert r.status == 200
    assert r.headers["Content-Type"] == "text/event-stream"
    assert r.headers["Access-Control-Allow-Origin"] == PAGE
    assert "X-Request-Id" in r.headers["Access-Control-Expose-Headers"]
    assert await r.text() == 'data: {"n":1}\n\ndata: [DONE]\n\n'


async def test_methods_and_headers_are_checked_headers_case_insensitively(tmp_path: Path) -> None:
    policy = CorsPolicy(origins=(PAGE,), methods=("get", "POST"), headers=("Authorization", "X-Request-Id"))
    c = await _client(policy, tmp_path)
    try:
        r = await c.options(CHAT, headers=_preflight(PAGE, "POST", "AUTHORIZATION, Content-Type, x-request-id"))
        assert r.status == 204
        assert r.headers["Access-Control-Allow-Methods"] == "GET, POST"
        # content-type (application/json) is allowed whatever the list says
        assert r.headers["Access-Control-Allow-Headers"] == "AUTHORIZATION, Content-Type, x-request-id"
        r = await c.options(CHAT, headers=_preflight(PAGE, "DELETE"))
        assert r.status == 403 and "DELETE" in (await r.json())["error"]["message"]
        r = await c.options(CHAT, headers=_preflight(PAGE, "POST", "authorization,x-secret"))
        assert r.status == 403 and "x-secret" in (await r.json())["error"]["message"]
        assert "Access-Control-Allow-Origin" not in r.headers
    finally:
        await c.close()


async def test_any_origin_without_credentials_is_a_wildcard(tmp_path: Path) -> None:
    c = await _client(CorsPolicy(origins=("*",)), tmp_path)
    try:
        r = await c.options(CHAT, headers=_preflight(OTHER))
        assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == "*"
        r = await c.get("/v1/models", headers={"Origin": "null", **AUTH})  # a file:// page
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        assert "origin" not in _vary(r)  # the same answer for every origin
    finally:
        await c.close()


async def test_credentials_echo_the_origin_never_a_wildcard(tmp_path: Path) -> None:
    c = await _client(CorsPolicy(origins=("*",), allow_credentials=True, max_age=5), tmp_path)
    try:
        r = await c.options(CHAT, headers=_preflight(OTHER))
        assert r.status == 204
        assert r.headers["Access-Control-Allow-Origin"] == OTHER
        assert r.headers["Access-Control-Allow-Credentials"] == "true"
        assert r.headers["Access-Control-Max-Age"] == "5"
        assert "origin" in _vary(r)
        for path in ("/v1/models", "/toy/stream", "/no/such/route"):
            r = await c.get(path, headers={"Origin": OTHER, **AUTH})
            assert r.headers["Access-Control-Allow-Origin"] == OTHER, path
            assert r.headers["Access-Control-Allow-Credentials"] == "true", path
            assert "origin" in _vary(r), path
    finally:
        await c.close()


async def test_a_configured_origin_matches_as_a_browser_spells_it(tmp_path: Path) -> None:
    c = await _client(CorsPolicy(origins=("HTTP://127.0.0.1:9000/",)), tmp_path)
    try:
        r = await c.options(CHAT, headers=_preflight(PAGE))
        assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == PAGE
        r = await c.options(CHAT, headers=_preflight("http://127.0.0.1:90000"))
        assert r.status == 403
    finally:
        await c.close()


async def test_cors_is_off_without_a_policy(tmp_path: Path) -> None:
    app = create_app(ServerConfig(store=StoreConfig(f"local:{tmp_path}")))
    async with TestClient(TestServer(app)) as c:
        r = await c.options(CHAT, headers=_preflight(PAGE))
        assert r.status == 405  # as any OPTIONS: a browser blocks the call
        r = await c.get("/v1/models", headers={"Origin": PAGE})
        assert r.status == 200
        assert not [h for h in r.headers if h.lower().startswith("access-control-")]
        assert "Vary" not in r.headers
