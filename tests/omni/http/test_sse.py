"""Assembly's shared parts on their own: collect() runs every choice to its end, interleave()
hands out each choice's deltas as they come and cancels the rest when left, ChunkStream sends
one event per delta, the usage chunk and [DONE], or an error event when a worker fails.
The choices come from FakePool through the real Generation and OutputRouter."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import msgspec
import orjson
import pytest
from aiohttp import web

from omni.engines.generation import Delta, Generation, OutputOptions, Usage
from omni.engines.llm import DeadlineExceeded, EngineError
from omni.engines.pool import ModelPool
from omni.errors import APIError
from omni.http.sse import ChunkStream, collect, interleave, json_response
from omni.modalities.outputs.router import OutputRouter
from omni.serving.bodies import usage_body
from omni.text.tokenizer import TextTokenizer
from scheduler.request import Request, SamplingParams
from tests.omni.fake_pool import FakeEvent, FakePool, FakeStream

HELLO = [1256, 964, 11, 288, 286, 692]  # "Hello there, world"


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def output(tokenizer: TextTokenizer, pool: FakePool, name: str) -> OutputRouter:
    g = Generation(cast(ModelPool, pool), tokenizer, [5, 6], SamplingParams(max_tokens=16), name, output=OutputOptions())
    return OutputRouter(g)


class Failing(OutputRouter):
    """A choice whose worker fails after its first delta."""

    def __init__(self, error: EngineError) -> None:
        self.error = error

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        yield Delta("x", [1])
        raise self.error


class Recorded:
    """StreamResponse's writing side: the bytes written, and whether it was ended."""

    def __init__(self) -> None:
        self.body = b""
        self.ended = False

    async def write(self, data: bytes) -> None:
        assert not self.ended
        self.body += data

    async def write_eof(self) -> None:
        self.ended = True

    def events(self) -> list[Any]:
        chunks = [c.removeprefix(b"data: ") for c in self.body.split(b"\n\n") if c]
        return [c.decode() if c == b"[DONE]" else orjson.loads(c) for c in chunks]


async def test_collect_joins_each_choices_text_and_keeps_its_finish(tokenizer: TextTokenizer) -> None:
    long, short = FakePool(HELLO), FakePool(HELLO[:2], finish_reason="stop")
    choices = await collect([output(tokenizer, long, "a"), output(tokenizer, short, "b")])
    assert [(c.text, c.finish_reason) for c in choices] == [("Hello there, world", "length"), ("Hello there", "stop")]
    assert choices[0].text_offsets == [0, 5, 11, 12, 14, 16]
    assert [lp.logprob for lp in choices[1].logprobs] == [-0.5, -0.5]
    assert long.aborted == [] and short.aborted == []  # both ran to their end


@pytest.mark.parametrize(("error", "status"), [(EngineError("llm worker failed"), 503), (DeadlineExceeded("late"), 504)])
async def test_an_engine_error_while_collecting_is_its_status(tokenizer: TextTokenizer, error: EngineError, status: int) -> None:
    pool = FakePool(HELLO)
    with pytest.raises(APIError) as raised:
        await collect([output(tokenizer, pool, "a"), Failing(error)])
    assert raised.value.status == status


@dataclass
class HeldPool(FakePool):
    """FakePool whose streams give their first token, then wait for a release that never comes."""

    def submit(self, request: Request, constraint: object = None) -> FakeStream:
        stream = super().submit(request)
        return cast(FakeStream, Held(stream.request, stream.events))


@dataclass
class Held(FakeStream):
    async def __aiter__(self) -> AsyncIterator[FakeEvent]:
        yield self.events[0]
        await asyncio.Event().wait()


async def test_leaving_interleave_early_aborts_every_choice(tokenizer: TextTokenizer) -> None:
    pools = [HeldPool(HELLO), HeldPool(HELLO)]
    outputs = [output(tokenizer, p, f"c{i}") for i, p in enumerate(pools)]
    async with aclosing(interleave(outputs)) as deltas:
        index, delta = await anext(deltas)
        assert (index, delta.text) in [(0, "Hello"), (1, "Hello")]
    assert [[rid for rid, _ in p.aborted] for p in pools] == [["c0"], ["c1"]]


async def test_interleave_tags_each_delta_with_its_choice_in_each_choices_order(tokenizer: TextTokenizer) -> None:
    outputs = [output(tokenizer, FakePool(HELLO[:3]), "a"), output(tokenizer, FakePool(HELLO[3:]), "b")]
    got = [(i, d.text) async for i, d in interleave(outputs)]
    assert [t for i, t in got if i == 0] == ["Hello", " there", ","]
    assert [t for i, t in got if i == 1] == [" w", "or", "ld"]


def chunk(choices: list[dict[str, Any]], usage: Any) -> msgspec.Struct:
    body: dict[str, Any] = {"id": "c", "choices": choices}
    if usage is not msgspec.UNSET:
        body["usage"] = usage
    return cast(msgspec.Struct, body)


def text_choice(index: int, delta: Delta) -> dict[str, Any] | None:
    if not delta.text and delta.finish_reason is None:
        return None
    return {"index": index, "text": delta.text, "finish_reason": delta.finish_reason}


async def test_a_stream_sends_a_chunk_a_delta_then_usage_and_done(tokenizer: TextTokenizer) -> None:
    response = Recorded()
    stream = ChunkStream(cast(web.StreamResponse, response), chunk, include_usage=True)
    router = output(tokenizer, FakePool(HELLO[:2]), "a")
    await stream.run([router], text_choice, lambda: usage_body(router.usage))  # type: ignore[arg-type]
    events = response.events()
    assert events[:2] == [
        {"id": "c", "choices": [{"index": 0, "text": "Hello", "finish_reason": None}], "usage": None},
        {"id": "c", "choices": [{"index": 0, "text": " there", "finish_reason": "length"}], "usage": None},
    ]
    usage = {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4, "prompt_tokens_details": {"cached_tokens": 0}}
    assert events[2] == {"id": "c", "choices": [], "usage": usage}
    assert events[3] == "[DONE]" and response.ended


async def test_continuous_usage_counts_each_chunks_tokens_so_far(tokenizer: TextTokenizer) -> None:
    response = Recorded()
    stream = ChunkStream(cast(web.StreamResponse, response), chunk, include_usage=True, continuous_usage=True)
    router = output(tokenizer, FakePool(HELLO[:3]), "a")
    await stream.run([router], text_choice, lambda: usage_body(router.usage))  # type: ignore[arg-type]
    usages = [e["usage"]["completion_tokens"] for e in response.events()[:-1]]
    assert usages == [1, 2, 3, 3]  # three token chunks, then the final usage


async def test_without_include_usage_chunks_have_no_usage_field(tokenizer: TextTokenizer) -> None:
    response = Recorded()
    stream = ChunkStream(cast(web.StreamResponse, response), chunk, include_usage=False)
    router = output(tokenizer, FakePool(HELLO[:1]), "a")
    await stream.run([router], text_choice, lambda: usage_body(Usage()))  # type: ignore[arg-type]
    events = response.events()
    assert len(events) == 2 and "usage" not in events[0] and events[1] == "[DONE]"


async def test_a_worker_failing_mid_stream_ends_it_with_an_error_event(tokenizer: TextTokenizer) -> None:
    response = Recorded()
    stream = ChunkStream(cast(web.StreamResponse, response), chunk, include_usage=True)
    await stream.run([Failing(DeadlineExceeded("too late"))], text_choice, lambda: usage_body(Usage()))  # type: ignore[arg-type]
    first, error, done = response.events()
    assert first["choices"][0]["text"] == "x"
    assert error["error"]["message"] == "too late" and error["error"]["code"] == "deadline_exceeded"
    assert done == "[DONE]" and response.ended


async def test_a_large_body_is_the_same_json_however_it_is_encoded() -> None:
    payload = {"data": list(range(5000))}
    small, large = await json_response(payload), await json_response(payload, num_items=5000, status=201)
    assert small.body == large.body == orjson.dumps(payload)
    assert (small.status, large.status, large.content_type) == (200, 201, "application/json")
