"""GET /v1/realtime?model=...: OpenAI's Realtime API over a WebSocket. The session itself is
omni/serving/realtime/session.py's; this handler upgrades the connection, feeds the session
each text (or binary) frame as one client event, in order, and writes the events it emits from
a queue, in order. The socket closing cancels what the session runs (omni's requests abort).

Auth is the HTTP API's (the app's middleware): the Authorization header, or, for browsers,
the subprotocol `openai-insecure-api-key.<key>`; the answer selects the subprotocol `realtime`
when the client offered it (a browser that offered protocols fails a handshake that selects none).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from omni.errors import bad_request
from omni.http.state import CONFIG, MODELS, VAD
from omni.serving.realtime.session import RealtimeSession

REALTIME_PATH = "/v1/realtime"
KEY_PROTOCOL = "openai-insecure-api-key."
MAX_FRAME_BYTES = 16 * 1024 * 1024  # OpenAI's append carries up to 15 MiB of base64
log = logging.getLogger("omni.http.realtime")


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
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    session = RealtimeSession(
        models, model, queue.put_nowait, vad_model=request.app[VAD].get(),
        max_buffer_seconds=request.app[CONFIG].realtime_max_buffer_seconds,
    )  # fmt: skip
    writer = asyncio.create_task(_write(ws, queue))
    session.start()
    try:
        async for msg in ws:
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                await session.handle(msg.data)
            elif msg.type == WSMsgType.ERROR:
                break
    finally:
        await session.close()
        queue.put_nowait(None)
        try:
            await asyncio.wait_for(writer, timeout=5)
        except (TimeoutError, asyncio.CancelledError, ConnectionError):
            writer.cancel()
        await ws.close()
    return ws


async def _write(ws: web.WebSocketResponse, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
    while (event := await queue.get()) is not None:
        if ws.closed:
            continue  # drained, not sent: the session's tasks may still emit as they end
        try:
            await ws.send_str(orjson.dumps(event).decode())
        except ConnectionError:
            log.debug("realtime: the client left while events were written")
