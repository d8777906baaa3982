"""A small fake OpenAI server for omni-bench's end-to-end tests.

Every reply streams max_tokens content chunks ("r<serial>t<i> "), delay_s apart (held after
hold_after of them, if set, until the test ends), after a role-only opening chunk, then a finish chunk and a usage chunk where prompt_tokens is
the number of words in the prompt and cached_tokens half of it (rounded down).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

MODEL = "fake-model"


@dataclass
class FakeServer:
    delay_s: float = 0.002
    fail_every: int | None = None  # every k-th request (1-based) gets HTTP 429
    stream_error_every: int | None = None  # every k-th request breaks off with an error event
    # A gate: each reply stops after this many content chunks until `release` is set (the
    # fixture sets it at the end), so a run can only end by its own timeout.
    hold_after: int | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    replies: dict[bytes, str] = field(default_factory=dict)  # orjson(messages or prompt) -> reply
    headers: list[dict[str, str]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_post("/v1/completions", self.complete)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        serial = len(self.bodies)
        if self.fail_every and serial % self.fail_every == 0:
            return web.json_response(
                {"error": {"message": "slow down", "type": "rate_limit", "code": 429}}, status=429)
        chat = "messages" in body
        prompt = body["messages"] if chat else body["prompt"]
        texts = [m["content"] for m in prompt] if chat else [prompt]
        num_prompt_tokens = sum(len(t.split()) for t in texts)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._stream(request, body, chat, serial, num_prompt_tokens)
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, body: dict[str, Any], chat: bool, serial: int,
                      num_prompt_tokens: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")

        def choice(text: str | None, finish: str | None = None) -> dict[str, Any]:
            if chat:
                delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
                return {"index": 0, "delta": delta, "finish_reason": finish}
            return {"index": 0, "text": text or "", "finish_reason": finish}

        await send({"id": f"c{serial}", "choices": [choice(None)]})
        pieces = [f"r{serial}t{i} " for i in range(body["max_tokens"])]
        for i, piece in enumerate(pieces):
            if i == self.hold_after:
                await self.release.wait()
            await asyncio.sleep(self.delay_s)
            if self.stream_error_every and serial % self.stream_error_every == 0 and i == 1:
                await send({"error": {"message": "engine died", "type": "internal_error", "code": 500}})
                return resp
            await send({"id": f"c{serial}", "choices": [choice(piece)]})
        self.replies[orjson.dumps(body["messages"] if chat else body["prompt"])] = "".join(pieces)
        await send({"id": f"c{serial}", "choices": [choice("" if chat else None, "length")]})
        await resp.write(b": keep-alive comment\n\n")
        await send({"id": f"c{serial}", "choices": [], "usage": {
            "prompt_tokens": num_prompt_tokens, "completion_tokens": len(pieces),
            "total_tokens": num_prompt_tokens + len(pieces),
            "prompt_tokens_details": {"cached_tokens": num_prompt_tokens // 2}}})
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
async def fake_server() -> AsyncIterator[FakeServer]:
    fake = FakeServer()
    server = TestServer(fake.app())
    await server.start_server()
    fake.url = str(server.make_url("/v1"))
    try:
        yield fake
    finally:
        fake.release.set()
        await server.close()
