"""The connection guard leans on three private fields of aiohttp's RequestHandler: this fails
first if an aiohttp upgrade removes them (the header deadline would then never fire)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from omni.http.connections import ConnectionLimits, GuardedRequestHandler, ServerRunner, _raw_response


def test_the_request_handler_fields_the_guard_reads_exist() -> None:
    slots = {name for cls in RequestHandler.__mro__ for name in getattr(cls, "__slots__", ())}
    assert {"_request_count", "_waiter", "_messages", "_manager"} <= slots


def test_a_raw_response_is_whole_http_with_an_openai_error() -> None:
    raw = _raw_response(408, "Request Timeout", "slow", "request_timeout")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert f"Content-Length: {len(body)}".encode() in head
    assert body == b'{"error":{"message":"slow","type":"invalid_request_error","param":null,"code":"request_timeout"}}'


async def test_the_header_deadline_is_armed_at_its_limit_and_cuts_a_slow_request_with_a_408(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deadline's length is the configured one, read off the timer it arms, not measured:
    the timer is held (it never fires by itself) and the test fires it, so nothing here waits
    on the clock. Until it fires the slow connection stays open; then it gets the 408."""
    loop = asyncio.get_running_loop()
    armed: list[tuple[float, Callable[[], None]]] = []
    call_later = loop.call_later

    def held(delay: float, callback: Callable[..., None], *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if getattr(callback, "__func__", None) is GuardedRequestHandler._on_header_timeout:
            armed.append((delay, callback))
            delay = 10**9  # the test fires it
        return call_later(delay, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_later", held)
    limits = ConnectionLimits(header_timeout=7.5, keepalive_timeout=60.0, max_connections=8)
    runner = ServerRunner(web.Application(), limits)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")  # never the end
        await writer.drain()
        server = runner.server
        assert server is not None

        async def partial_request() -> None:  # accepted, and its bytes read: a few loop turns
            while not (server.connections and server.connections[0]._partial):  # type: ignore[attr-defined]
                await asyncio.sleep(0)

        await asyncio.wait_for(partial_request(), 120)  # a hang guard, not a timing
        (handler,) = server.connections
        assert isinstance(handler, GuardedRequestHandler)
        assert [delay for delay, _ in armed] == [7.5]
        assert not reader.at_eof() and not handler.transport.is_closing()  # type: ignore[union-attr]
        armed[0][1]()  # the deadline passes
        answer = await reader.read()
        writer.close()
    finally:
        await runner.cleanup()
    assert answer == _raw_response(408, "Request Timeout", "The request headers took too long.", "request_timeout")
