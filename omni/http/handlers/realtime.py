"""GET /v1/realtime?model=...: OpenAI's Realtime API over a WebSocket. The session itself is
omni/serving/realtime/session.py's; this handler upgrades the connection, feeds the session
each text (or binary) frame as one client event, in order, and writes the events it emits from
a queue, in order. The socket closing cancels what the session runs (omni's requests abort).

Auth is the HTTP API's (the app's middleware): the Authorization header, or, for browsers,
the subprotocol `openai-insecure-api-key.<key>`; the answer selects the subprotocol `realtime`
when the client offered it (a browser that offered protocols fails a handshake that selects none).
Each session counts in vLLM's WebSocket series (vllm:websocket_connections_active, _total,
_duration_seconds), from the upgrade to the socket's close.

The outgoing events wait in a bounded queue (Outbox): a client that stops reading while a
response streams would otherwise make the server hold every audio delta it has not taken. Past
MAX_PENDING_EVENTS the session ends: what is pending is dropped, an `error` event
(`event_queue_overflow`) and a close (1008) are attempted, and the connection is cut if they
are not written within CLOSE_GRACE_S; the session's requests abort as on any disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import WSCloseCode, WSMsgType, web

from omni.errors import bad_request
from omni.http.state import CONFIG, METRICS, MODELS, VAD
from omni.serving.realtime.session import RealtimeSession

REALTIME_PATH = "/v1/realtime"
KEY_PROTOCOL = "openai-insecure-api-key."
MAX_FRAME_BYTES = 16 * 1024 * 1024  # OpenAI's append carries up to 15 MiB of base64
MAX_PENDING_EVENTS = 1024  # events written to no one yet; an audio delta is ~10 KB of base64
CLOSE_GRACE_S = 2.0
log = logging.getLogger("omni.http.realtime")

Event = dict[str, Any]


class Outbox:
    """The session's outgoing events, at most `limit` waiting. put() is the session's emit: past
    the limit the pending events are dropped, one `error` event and the end (None) are queued in
    their place, on_overflow is called once, and later events are dropped."""

    def __init__(self, limit: int, on_overflow: Callable[[], None]) -> None:
        self.limit = limit
        self.on_overflow = on_overflow
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self.overflowed = False

    def put(self, event: Event) -> None:
        if self.overflowed:
            return
        if self.queue.qsize() >= self.limit:
            self.overflowed = True
            while not self.queue.empty():
                self.queue.get_nowait()
            error = {"type": "server_error", "code": "event_queue_overflow", "param": None, "event_id": None,
                     "message": f"The client did not read its events ({self.limit} pending): the session is closed."}  # fmt: skip
            self.queue.put_nowait({"type": "error", "event_id": "event_overflow", "error": error})
            self.queue.put_nowait(None)
            self.on_overflow()
            return
        self.queue.put_nowait(event)

    def end(self) -> None:
        if not self.overflowed:
            self.queue.put_nowait(None)


async def realtime(request: web.Request) -> web.StreamResponse:
    models = request.app[MODELS]
    name = request.query.get("model")
    if name is None:
        served = list(models)
        if len(served) != 1:
            raise bad_request("Name the model: /v1/realtime?model=<name>.", param="model")
        model = served[0]
    else:
        model = models.get(name)  # a 404 before the upgrade
    ws = web.WebSocketResponse(protocols=("realtime",), max_msg_size=MAX_FRAME_BYTES, heartbeat=30.0)
    await ws.prepare(request)
    metrics = request.app[METRICS]
    metrics.websocket_opened()
    opened = time.monotonic()
    outbox = Outbox(MAX_PENDING_EVENTS, lambda: _cut_off(request, writer))
    session = RealtimeSession(
        models, model, outbox.put, vad_model=request.app[VAD].get(),
        max_buffer_seconds=request.app[CONFIG].realtime_max_buffer_seconds, metrics=metrics,
    )  # fmt: skip
    writer = asyncio.create_task(_write(ws, outbox.queue, lambda: outbox.overflowed))
    session.start()
    try:
        async for msg in ws:
            if outbox.overflowed:
                break
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                await session.handle(msg.data)
            elif msg.type == WSMsgType.ERROR:
                break
    finally:
        try:
            await session.close()
            outbox.end()
            try:
                await asyncio.wait_for(writer, timeout=5)
            except (TimeoutError, asyncio.CancelledError, ConnectionError):
                writer.cancel()
            await ws.close()
        finally:
            metrics.websocket_closed(time.monotonic() - opened)
    return ws


def _cut_off(request: web.Request, writer: asyncio.Task[None]) -> None:
    """The outbox overflowed: the writer sends the error and closes (1008) if the client takes
    them within CLOSE_GRACE_S; else the connection is aborted. Either way the read loop ends."""
    log.warning("realtime: a client left %d events unread; its session is closed", MAX_PENDING_EVENTS)

    def abort() -> None:
        if not writer.done() and request.transport is not None:
            request.transport.abort()

    asyncio.get_running_loop().call_later(CLOSE_GRACE_S, abort)


async def _write(ws: web.WebSocketResponse, queue: asyncio.Queue[Event | None], overflowed: Callable[[], bool]) -> None:
    while (event := await queue.get()) is not None:
        if ws.closed:
            continue  # drained, not sent: the session's tasks may still emit as they end
        try:
            await ws.send_str(orjson.dumps(event).decode())
        except ConnectionError:
            log.debug("realtime: the client left while events were written")
    if overflowed() and not ws.closed:
        # the read loop may wait on a client that sends nothing: closing wakes it
        try:
            await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"event queue overflow")
        except ConnectionError:
            log.debug("realtime: the client left before the close")
