"""Assembly's shared parts: server-sent events, encoding the bodies, and running the
choices of one request side by side (their routed outputs, omni/modalities/outputs/router.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import msgspec
from aiohttp import web

from omni.engines.generation import Delta, TokenLogprob, Usage
from omni.engines.llm import EngineError
from omni.modalities.outputs.router import OutputRouter
from omni.serving.bodies import ChunkUsage, usage_body
from omni.serving.bodies import Usage as UsageBody
from omni.serving.errors import engine_error

# One encoder for every body and event: msgspec encodes the response Structs (and the plain
# dicts of error events) without building an intermediate dict.
_encoder = msgspec.json.Encoder()
encode = _encoder.encode


class _Choice(Protocol):
    @property
    def finish_reason(self) -> str | None: ...


C = TypeVar("C", bound=_Choice)  # a chunk's choice: chat's or text completions'


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


# A whole (non-streamed) body with more choices or logprob entries than this is encoded in a
# worker thread; msgspec holds the GIL while it runs, but the Python around it (and the other
# requests' handlers between its calls) does not wait for a long encode to finish.
_ENCODE_IN_THREAD_ITEMS = 4096


async def json_response(payload: object, *, num_items: int = 0, status: int = 200) -> web.Response:
    """The JSON body of a whole response (a response Struct, as the stream's events are);
    num_items: how many choices, tokens and logprob entries it holds, to decide where it is
    encoded."""
    if num_items > _ENCODE_IN_THREAD_ITEMS:
        body = await asyncio.to_thread(msgspec.json.encode, payload)  # the module's, not a shared Encoder
    else:
        body = encode(payload)
    return web.Response(body=body, status=status, content_type="application/json")


async def send_event(response: web.StreamResponse, payload: object) -> None:
    await response.write(b"data: " + encode(payload) + b"\n\n")


async def send_done(response: web.StreamResponse) -> None:
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()


async def send_error_and_done(response: web.StreamResponse, exc: EngineError) -> None:
    """A worker failed, or a deadline passed, mid-stream: the status is sent already, so say it
    in an event (the error object that status would have carried: engine_error)."""
    await send_event(response, engine_error(exc).to_dict())
    await send_done(response)


class ChunkStream(Generic[C]):
    """One streamed completion. chunk(choices, usage) makes each chunk (every one with the same
    id, object, created and model). When stream_options.include_usage was asked for, a chunk's
    usage is null until the last chunk, or with continuous_usage (vLLM's
    continuous_usage_stats) the running usage of the chunk's choice, its prompt and the tokens
    it has generated so far; without it, a chunk has no usage field."""

    def __init__(
        self,
        response: web.StreamResponse,
        chunk: Callable[[list[C], ChunkUsage], msgspec.Struct],
        include_usage: bool,
        continuous_usage: bool = False,
    ) -> None:
        self.response = response
        self.chunk = chunk
        self.include_usage = include_usage
        self.continuous_usage = include_usage and continuous_usage

    async def send(self, choices: list[C], usage: UsageBody | None = None) -> None:
        body: ChunkUsage = msgspec.UNSET
        if self.include_usage:
            body = usage
        await send_event(self.response, self.chunk(choices, body))

    def chunk_usage(self, output: OutputRouter, completion_tokens: int = 0) -> UsageBody | None:
        """What a chunk of this choice carries as its usage before the last chunk: with
        continuous_usage its prompt and the completion_tokens its chunks have carried so far,
        else None (null). A chunk sent before any token (chat's role) has 0 of them."""
        if not self.continuous_usage:
            return None
        return usage_body(Usage(output.usage.prompt_tokens, completion_tokens, output.usage.cached_tokens))

    async def run(
        self,
        outputs: Sequence[OutputRouter],
        choice: Callable[[int, Delta], C | None],
        usage: Callable[[], UsageBody],
        extra: Callable[[int], list[C]] | None = None,
    ) -> None:
        """Send one chunk per delta that choice() turns into a choice (None: skip it), then the
        usage chunk and [DONE]; a worker failure mid-stream ends it with an error event.
        extra(index): more choices to send after each delta's (chat's drawn images)."""
        generated = [0] * len(outputs)  # tokens of each choice's deltas so far
        try:
            async with aclosing(interleave(outputs)) as deltas:  # a client gone aborts at once
                async for index, delta in deltas:
                    generated[index] += len(delta.token_ids)
                    c = choice(index, delta)
                    sent = [] if c is None else [c]
                    if extra is not None:
                        more = extra(index)
                        # what the delta completed goes before the choice's last chunk
                        sent = more + sent if c is not None and c.finish_reason is not None else sent + more
                    for out in sent:
                        await self.send([out], self.chunk_usage(outputs[index], generated[index]))
        except EngineError as exc:
            await send_error_and_done(self.response, exc)
            return
        if self.include_usage:
            await self.send([], usage())
        await send_done(self.response)


@dataclass(slots=True)
class Choice:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or client stop token id that ended it
    text_offsets: list[int] = field(default_factory=list)  # each token's, in text (Delta's)
    # What its output spans made, by kind (as Delta.pieces; OutputKind.pieces reads them), in order
    pieces: dict[str, list[Any]] = field(default_factory=dict)


async def collect(outputs: Sequence[OutputRouter]) -> list[Choice]:
    """Run every choice to its end; an engine error becomes its status (engine_error: a failed
    worker a 503, a passed deadline a 504, a refusal a 429)."""
    parts: list[list[str]] = [[] for _ in outputs]
    choices = [Choice() for _ in outputs]
    try:
        async with aclosing(interleave(outputs)) as deltas:
            async for index, delta in deltas:
                parts[index].append(delta.text)
                choices[index].logprobs.extend(delta.logprobs)
                choices[index].text_offsets.extend(delta.text_offsets)
                for kind, made in delta.pieces.items():
                    choices[index].pieces.setdefault(kind, []).extend(made)
                if delta.finish_reason is not None:
                    choices[index].finish_reason = delta.finish_reason
                    choices[index].stop_reason = delta.stop_reason
    except EngineError as exc:
        raise engine_error(exc) from exc
    for choice, text in zip(choices, parts):
        choice.text = "".join(text)
    return choices


async def interleave(outputs: Sequence[OutputRouter]) -> AsyncGenerator[tuple[int, Delta], None]:
    """Yield (choice index, delta) from every choice's output as its tokens arrive.

    The pump tasks belong to this generator: leaving it early (client gone, error)
    cancels them, and each Generation then aborts its request.
    """
    if len(outputs) == 1:  # the common case needs no tasks
        async with aclosing(outputs[0].deltas()) as deltas:
            async for delta in deltas:
                yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, output: OutputRouter) -> None:
        try:
            async for delta in output.deltas():
                queue.put_nowait((index, delta))
        except Exception as exc:  # handed to the consumer, which raises it
            queue.put_nowait((index, exc))
            return
        queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i, o)) for i, o in enumerate(outputs)]
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
