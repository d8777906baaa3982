"""Server-sent events, and running several choices of one request side by side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from omni.api.errors import service_unavailable
from omni.engine import EngineError
from omni.generation import Delta, Generation, TokenLogprob


async def open_event_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # tell reverse proxies not to buffer the stream
        }
    )
    await response.prepare(request)
    return response


async def send_event(response: web.StreamResponse, payload: object) -> None:
    await response.write(b"data: " + orjson.dumps(payload) + b"\n\n")


async def send_done(response: web.StreamResponse) -> None:
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()


async def send_error_and_done(response: web.StreamResponse, exc: EngineError) -> None:
    """A worker failed mid-stream: the status is sent already, so say it in an event."""
    await send_event(response, service_unavailable(str(exc)).to_dict())
    await send_done(response)


@dataclass(slots=True)
class Choice:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


async def collect(generations: Sequence[Generation]) -> list[Choice]:
    """Run every generation to its end; a worker failure becomes a 503."""
    parts: list[list[str]] = [[] for _ in generations]
    choices = [Choice() for _ in generations]
    try:
        async for index, delta in interleave(generations):
            parts[index].append(delta.text)
            choices[index].logprobs.extend(delta.logprobs)
            if delta.finish_reason is not None:
                choices[index].finish_reason = delta.finish_reason
    except EngineError as exc:
        raise service_unavailable(str(exc)) from exc
    for choice, text in zip(choices, parts):
        choice.text = "".join(text)
    return choices


async def interleave(generations: Sequence[Generation]) -> AsyncIterator[tuple[int, Delta]]:
    """Yield (choice index, delta) from all generations as their tokens arrive.

    The pump tasks belong to this generator: leaving it early (client gone, error)
    cancels them, and each Generation then aborts its request.
    """
    if len(generations) == 1:  # the common case needs no tasks
        async for delta in generations[0].deltas():
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, generation: Generation) -> None:
        try:
            async for delta in generation.deltas():
                queue.put_nowait((index, delta))
        except Exception as exc:  # handed to the consumer, which raises it
            queue.put_nowait((index, exc))
            return
        queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(generations)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
