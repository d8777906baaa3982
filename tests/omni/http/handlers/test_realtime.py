"""GET /v1/realtime's handler on an app of its own (aiohttp's test client; no engines): the
browser's API key in the WebSocket subprotocol, and the bounded queue of outgoing events.
The session's events with a served model are tests/e2e/test_realtime.py's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.config import ServerConfig
from omni.http.app import create_app
from omni.http.handlers import realtime
from omni.http.state import METRICS, MODELS

KEY = "secret-key"


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    """An app with an API key and one served model that is only a name (a session needs no
    engine until a response or transcription runs)."""
    app = create_app(ServerConfig(api_key=KEY))
    async with TestClient(TestServer(app)) as c:
        app[MODELS].add(cast(Any, SimpleNamespace(name="m", output=lambda kind: None)))
        yield c


async def test_the_key_in_the_subprotocol_opens_a_session(client: TestClient[Any, Any]) -> None:
    async with client.ws_connect("/v1/realtime?model=m", protocols=("realtime", f"openai-insecure-api-key.{KEY}")) as ws:
        assert ws.protocol == "realtime"  # the key is never echoed back
        created = await ws.receive_json(timeout=120)
        assert created["type"] == "session.created" and created["session"]["model"] == "m"


async def test_the_key_in_the_header_opens_a_session(client: TestClient[Any, Any]) -> None:
    async with client.ws_connect("/v1/realtime?model=m", headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert (await ws.receive_json(timeout=120))["type"] == "session.created"


@pytest.mark.parametrize(
    "protocols",
    [("realtime", "openai-insecure-api-key.wrong"), ("realtime",), ("realtime", f"openai-insecure-api-key.{KEY}x")],
)
async def test_a_wrong_or_missing_key_is_refused_before_the_upgrade(
    client: TestClient[Any, Any], protocols: tuple[str, ...]
) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect("/v1/realtime?model=m", protocols=protocols)
    assert refused.value.status == 401
    response = await client.get("/v1/realtime?model=m", headers={"Sec-WebSocket-Protocol": ", ".join(protocols)})
    assert response.status == 401 and (await response.json())["error"]["message"]


async def test_the_key_as_a_subprotocol_of_a_plain_get_is_not_auth(client: TestClient[Any, Any]) -> None:
    """Only an upgrade may carry the key as a subprotocol (a plain request names it in the header)."""
    response = await client.get("/v1/models", headers={"Sec-WebSocket-Protocol": f"openai-insecure-api-key.{KEY}"})
    assert response.status == 401


async def test_a_session_counts_as_an_open_websocket_until_it_closes(client: TestClient[Any, Any]) -> None:
    metrics = client.app[METRICS]
    total = metrics.registry.get_sample_value("vllm:websocket_connections_total")
    async with client.ws_connect("/v1/realtime?model=m", headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert (await ws.receive_json(timeout=120))["type"] == "session.created"
        assert metrics.registry.get_sample_value("vllm:websocket_connections_active") == 1
        assert metrics.registry.get_sample_value("vllm:websocket_connections_total") == total + 1
    async def closed() -> None:  # the server sees the close after the client
        while metrics.registry.get_sample_value("vllm:websocket_connections_active") != 0:
            await asyncio.sleep(0.05)

    await asyncio.wait_for(closed(), 120)  # a hang guard, not a timing
    assert metrics.registry.get_sample_value("vllm:websocket_connections_active") == 0
    assert metrics.registry.get_sample_value("vllm:websocket_connection_duration_seconds_count") == 1
    labels = {"model_name": "m", "status": "completed"}
    assert metrics.registry.get_sample_value("omni_realtime_responses_total", labels) == 0


async def test_the_outbox_holds_at_most_its_limit_then_ends_with_an_error() -> None:
    overflows: list[int] = []
    outbox = realtime.Outbox(3, lambda: overflows.append(1))
    for i in range(3):
        outbox.put({"type": "x", "n": i})
    assert outbox.queue.qsize() == 3 and not outbox.overflowed and not overflows
    for i in range(1000):  # a client that never reads
        outbox.put({"type": "response.output_audio.delta", "delta": "A" * 1000, "n": i})
    assert outbox.overflowed and overflows == [1]  # once
    pending = [outbox.queue.get_nowait() for _ in range(outbox.queue.qsize())]
    assert len(pending) == 2 and pending[1] is None  # the pending events dropped: the error, then the end
    assert pending[0] is not None and pending[0]["type"] == "error"
    assert pending[0]["error"]["code"] == "event_queue_overflow"
    outbox.end()  # the session's own end adds nothing after the overflow
    assert outbox.queue.empty()


async def test_a_session_whose_events_overflow_is_closed_with_an_error(
    client: TestClient[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no room at all, session.created already overflows: the client gets the error event,
    then a close (1008), and the session ends (the server's loop is not left waiting on it)."""
    monkeypatch.setattr(realtime, "MAX_PENDING_EVENTS", 0)
    async with client.ws_connect("/v1/realtime?model=m", headers={"Authorization": f"Bearer {KEY}"}) as ws:
        first = await ws.receive(timeout=30)
        assert first.type == aiohttp.WSMsgType.TEXT
        error = orjson.loads(first.data)
        assert error["type"] == "error" and error["error"]["code"] == "event_queue_overflow"
        closing = await ws.receive(timeout=30)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
        assert ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION


async def test_a_client_that_takes_nothing_is_cut_off(
    client: TestClient[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's writes never complete (a client whose socket takes nothing more): past the
    bound the session does not wait on them; the connection is aborted after the grace."""
    stalled = asyncio.Event()

    async def never(self: web.WebSocketResponse, data: str, compress: int | None = None) -> None:
        stalled.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(web.WebSocketResponse, "send_str", never)
    monkeypatch.setattr(realtime, "MAX_PENDING_EVENTS", 2)
    monkeypatch.setattr(realtime, "CLOSE_GRACE_S", 0.1)
    async with client.ws_connect("/v1/realtime?model=m", headers={"Authorization": f"Bearer {KEY}"}) as ws:
        await asyncio.wait_for(stalled.wait(), 30)  # session.created is stuck in the writer
        for _ in range(3):  # each an error event, none written: the third overflows, and no frame follows
            await ws.send_str("{not json")
        end = await ws.receive(timeout=30)
        assert end.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR), end
