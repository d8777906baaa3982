"""Connection hygiene: how long a client may take to send a request, and how many may be open.

aiohttp bounds header sizes and idle keep-alive time, but has no header-read deadline: a
client that sends one header byte every few seconds holds its connection (and a file
descriptor) for as long as it likes. ServerRunner is an AppRunner whose connections are
GuardedRequestHandlers:

    connection opened ----- first byte ----- headers complete ..... response sent ... next byte
    |<- header_timeout ----------------->|                        |<- keepalive ->|
                            (armed at the opening; re-armed by the first byte after a response)

- headers not complete within header_timeout: a 408 and the connection is closed (closed
  quietly if nothing came at all);
- an idle keep-alive connection: closed after keepalive_timeout (aiohttp's own timer);
- more than max_connections open: the new one gets a 503 and is closed at once.

The body's own deadline is the reader's (omni/http/body.py read_json), where a 408
can still be an OpenAI error object.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("omni.http.connections")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout: float
    keepalive_timeout: float
    max_connections: int


def _raw_response(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response with an OpenAI error body, written before any request is read."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


_HEADER_TIMEOUT = _raw_response(408, "Request Timeout", "The request headers took too long.", "request_timeout")
_TOO_MANY = _raw_response(
    503, "Service Unavailable", "Too many open connections; retry shortly.", "too_many_connections"
)


class GuardedRequestHandler(RequestHandler):
    """aiohttp's protocol with a header deadline and the connection cap.

    It reads three of RequestHandler's private fields (3.14): `_request_count` (messages
    parsed), `_waiter` (set while start() waits for a request) and `_messages` (the parsed
    requests not yet handled);
    tests/omni/http/test_connections.py fails if they go away.
    """

    def __init__(self, manager: web.Server, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(manager, keepalive_timeout=limits.keepalive_timeout, **kwargs)
        self._limits = limits
        self._header_deadline: asyncio.TimerHandle | None = None
        self._parsed = 0  # _request_count when the deadline was armed
        self._partial = False  # bytes of a request came since it was armed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        manager = self._manager
        if manager is not None and len(manager.connections) > self._limits.max_connections:
            log.warning("%d connections open: refusing one", len(manager.connections))
            self._reject(_TOO_MANY)
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        idle = self._idle()  # before this data: waiting for a request's first byte
        super().data_received(data)
        if self._request_count != self._parsed:
            self._disarm()  # a request's headers are complete
        elif self._header_deadline is not None:
            self._partial = True
        elif idle:
            self._arm()  # the first bytes of the next request on a kept-alive connection
            self._partial = True

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _idle(self) -> bool:
        # start() awaits _waiter only between requests: not while a body is read or a request
        # is handled, nor between a request's parsing and its handler starting.
        return self._waiter is not None and not self._messages

    def _arm(self) -> None:
        self._parsed = self._request_count
        self._partial = False
        self._header_deadline = self._loop.call_later(self._limits.header_timeout, self._on_header_timeout)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _on_header_timeout(self) -> None:
        self._header_deadline = None
        if self._request_count != self._parsed:
            return
        if self._partial:  # part of a request came: say why it is cut off
            self._reject(_HEADER_TIMEOUT)
        else:  # nothing came: close quietly, as an idle keep-alive connection is closed
            self._reject(b"")

    def _reject(self, response: bytes) -> None:
        transport = self.transport
        if response and transport is not None and not transport.is_closing():
            transport.write(response)
        self.force_close()
        if transport is not None:
            transport.close()  # force_close alone waits for the handler task to notice


class GuardedServer(web.Server):
    """The application's web.Server, whose connections are GuardedRequestHandlers."""

    def __init__(self, inner: web.Server, limits: ConnectionLimits) -> None:
        # inner._kwargs: the handler options the AppRunner and application chose (access log,
        # debug, handler_args), which every connection takes.
        super().__init__(
            inner.request_handler,
            request_factory=inner.request_factory,
            handler_cancellation=inner.handler_cancellation,
            loop=inner._loop,
            **inner._kwargs,
        )
        self.limits = limits

    def __call__(self) -> RequestHandler:
        return GuardedRequestHandler(self, self.limits, loop=self._loop, **self._kwargs)


class ServerRunner(web.AppRunner):
    """web.AppRunner with the connection limits on every connection its sites accept."""

    def __init__(self, app: web.Application, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.limits = limits

    async def _make_server(self) -> web.Server:
        return GuardedServer(await super()._make_server(), self.limits)
