"""Streams one request to an OpenAI-compatible server and times it.

aiohttp and hand-parsed SSE lines rather than the openai library: the benchmark often
shares a small machine with the server, and every client CPU cycle is taken from it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson

from bench.omni_bench.record import RequestRecord
from bench.omni_bench.workload import Conversation

Endpoint = Literal["chat", "completions"]
_PATHS: dict[str, str] = {"chat": "/chat/completions", "completions": "/completions"}


@dataclass(frozen=True)
class ClientConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key: str | None = field(default=None, repr=False)
    endpoint: Endpoint = "chat"
    temperature: float = 0.0
    ignore_eos: bool = False  # vLLM/SGLang extension; strict servers reject unknown fields
    extra_body: dict[str, Any] = field(default_factory=dict)


class RequestFailed(Exception):
    def __init__(self, message: str, http_status: int | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status


def open_session() -> aiohttp.ClientSession:
    # No connection limit (the runner paces requests) and no total timeout (aiohttp's
    # default of 300 s would cut long generations; --timeout bounds the run instead).
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
    )


def error_message(body: bytes) -> str:
    """The message of an OpenAI error body ({"error": {"message": ...}}), else the text."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace").strip()[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        if isinstance(err, str):
            return err[:500]
    return str(data)[:500]


class Client:
    def __init__(self, config: ClientConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self.session = session
        self.base_url = config.base_url.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if config.api_key:
            self.headers["Authorization"] = f"Bearer {config.api_key}"

    async def list_models(self) -> list[str]:
        async with self.session.get(f"{self.base_url}/models", headers=self.headers) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise RequestFailed(f"GET /models: HTTP {resp.status}: {error_message(body)}", resp.status)
        return [m["id"] for m in orjson.loads(body).get("data", [])]

    def payload(self, model: str, conversation: Conversation, replies: list[str]) -> dict[str, Any]:
        turn = len(replies)
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": conversation.max_tokens[turn],
            "temperature": self.config.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.config.endpoint == "chat":
            body["messages"] = conversation.messages(replies)
        else:
            body["prompt"] = conversation.prompt(replies)
        if self.config.ignore_eos:
            body["ignore_eos"] = True
        body.update(self.config.extra_body)
        return body

    async def send(self, payload: dict[str, Any], record: RequestRecord, phase_start: float) -> str:
        """Stream one request, filling record in place; returns the reply's content.

        The record stays "cancelled" when the task is cancelled (the run's --timeout).
        """
        start = time.perf_counter()
        record.start_s = start - phase_start
        parts: list[str] = []
        try:
            await self._stream(payload, record, start, parts)
        except (RequestFailed, aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            record.outcome = "error"
            record.e2e_s = time.perf_counter() - start
            record.http_status = getattr(exc, "http_status", None)
            record.error = str(exc) if isinstance(exc, RequestFailed) else f"{type(exc).__name__}: {exc}"
            return "".join(parts)
        record.outcome = "ok"
        return "".join(parts)

    async def _stream(self, payload: dict[str, Any], record: RequestRecord, start: float,
                      parts: list[str]) -> None:
        url = self.base_url + _PATHS[self.config.endpoint]
        chat = self.config.endpoint == "chat"
        last = 0.0
        async with self.session.post(url, data=orjson.dumps(payload), headers=self.headers) as resp:
            record.http_status = resp.status
            if resp.status != 200:
                raise RequestFailed(f"HTTP {resp.status}: {error_message(await resp.read())}", resp.status)
            async for line in resp.content:
                now = time.perf_counter()
                if not line.startswith(b"data:"):
                    continue  # blank separators, ": keep-alive" comments, event: lines
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = orjson.loads(data)
                if chunk.get("error"):  # an error event after the 200 header went out
                    raise RequestFailed(f"stream error: {error_message(data)}", resp.status)
                usage = chunk.get("usage")
                if usage:
                    record.usage_reported = True
                    record.num_prompt_tokens = usage.get("prompt_tokens")
                    record.num_completion_tokens = usage.get("completion_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    record.num_cached_tokens = details.get("cached_tokens")
                for choice in chunk.get("choices") or ():
                    if chat:
                        delta = choice.get("delta") or {}
                        text = delta.get("content")
                        # Reasoning tokens are tokens too (they count for TTFT and ITL),
                        # but are not resent as history.
                        token_bearing = bool(text or delta.get("reasoning_content"))
                    else:
                        text = choice.get("text")
                        token_bearing = bool(text)
                    if token_bearing:
                        if record.ttft_s is None:
                            record.ttft_s = now - start
                        else:
                            record.itl_s.append(now - last)
                        last = now
                        record.num_chunks += 1
                    if text:
                        parts.append(text)
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
        record.e2e_s = time.perf_counter() - start
