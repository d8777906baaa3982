"""The transcription API's response formats, from a prepared transcription whose one choice is
a FakePool's scripted transcript: json (usage with the audio's tokens apart), text,
verbose_json (one segment, the whole clip), logprobs without the stop token, and the stream of
named events (an error event when the worker fails). The lifecycle that prepares it from an
upload is tests/omni/serving/requests/test_transcriptions.py's and the e2e tests'."""

from __future__ import annotations

import zlib
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.engines.generation import Delta, Generation, OutputOptions
from omni.engines.llm import EngineError
from omni.engines.pool import ModelPool
from omni.http.errors import error_middleware
from omni.http.handlers.transcriptions import respond
from omni.modalities.outputs.router import OutputRouter
from omni.serving.model import ServedModel
from omni.serving.requests.transcriptions import TranscriptionRequest
from omni.serving.transcriptions import Transcription
from omni.text.tokenizer import TextTokenizer
from scheduler.request import SamplingParams
from tests.omni.fake_pool import FakePool

HELLO = [1256, 964, 11, 288, 286, 692]  # "Hello there, world"
EOS = 1282
PROMPT = list(range(20))  # 12 of them stand for the audio


class Failing(OutputRouter):
    def __init__(self, generation: Generation) -> None:
        self.generation = generation

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        yield Delta("Hel", [1])
        raise EngineError("llm worker failed: gone")


async def client_for(tokenizer: TextTokenizer, req: TranscriptionRequest, *, failing: bool = False) -> TestClient[Any, Any]:
    model = ServedModel("m", tokenizer, cast(ModelPool, FakePool([*HELLO, EOS], finish_reason="stop")), created=0)

    async def handler(request: web.Request) -> web.StreamResponse:
        g = Generation(model.pool, tokenizer, PROMPT, SamplingParams(max_tokens=32), "tr-1", output=OutputOptions())
        output = Failing(g) if failing else OutputRouter(g)
        t = Transcription(model=model, outputs=[output], timeout=None, duration=2.34567, num_audio_tokens=12)
        return await respond(request, req, t)

    app = web.Application(middlewares=[error_middleware])
    app.router.add_post("/t", handler)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def request(**fields: Any) -> TranscriptionRequest:
    return TranscriptionRequest(model=None, file=b"audio", **fields)


async def answer(tokenizer: TextTokenizer, req: TranscriptionRequest, **kwargs: Any) -> tuple[int, str, bytes]:
    client = await client_for(tokenizer, req, **kwargs)
    try:
        r = await client.post("/t")
        return r.status, r.headers["Content-Type"], await r.read()
    finally:
        await client.close()


async def test_json_is_the_text_and_the_usage_with_the_audio_apart(tokenizer: TextTokenizer) -> None:
    status, _, body = await answer(tokenizer, request())
    assert status == 200
    assert orjson.loads(body) == {
        "text": "Hello there, world",
        "usage": {
            "type": "tokens", "input_tokens": 20, "input_token_details": {"text_tokens": 8, "audio_tokens": 12},
            "output_tokens": 7, "total_tokens": 27,
        },
    }  # fmt: skip


async def test_text_is_the_transcript_alone(tokenizer: TextTokenizer) -> None:
    status, content_type, body = await answer(tokenizer, request(response_format="text"))
    assert (status, body) == (200, b"Hello there, world")
    assert content_type.startswith("text/plain")


async def test_verbose_json_is_one_segment_over_the_whole_clip(tokenizer: TextTokenizer) -> None:
    _, _, body = await answer(tokenizer, request(response_format="verbose_json", language="en", temperature=0.2))
    verbose = orjson.loads(body)
    assert (verbose["task"], verbose["language"], verbose["duration"], verbose["text"]) == ("transcribe", "en", 2.346, "Hello there, world")
    (segment,) = verbose["segments"]
    raw = b"Hello there, world"
    assert (segment["id"], segment["start"], segment["end"], segment["tokens"]) == (0, 0.0, 2.346, [*HELLO, EOS])
    assert (segment["temperature"], segment["avg_logprob"], segment["no_speech_prob"]) == (0.2, -0.5, 0.0)
    assert segment["compression_ratio"] == pytest.approx(len(raw) / len(zlib.compress(raw)))
    assert verbose["usage"] == {"type": "duration", "seconds": 2.346}
    _, _, unnamed = await answer(tokenizer, request(response_format="verbose_json"))
    assert orjson.loads(unnamed)["language"] == "unknown"


async def test_logprobs_are_the_transcripts_tokens_without_the_stop(tokenizer: TextTokenizer) -> None:
    _, _, body = await answer(tokenizer, request(logprobs=True))
    entries = orjson.loads(body)["logprobs"]
    assert [e["token"] for e in entries] == ["Hello", " there", ",", " w", "or", "ld"]
    assert all(e["logprob"] == -0.5 for e in entries)


def events(body: bytes) -> list[tuple[str, Any]]:
    out = []
    for block in body.decode().split("\n\n"):
        if block:
            kind, data = block.split("\n")
            out.append((kind.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return out


async def test_a_stream_is_deltas_then_done(tokenizer: TextTokenizer) -> None:
    status, content_type, body = await answer(tokenizer, request(stream=True))
    assert (status, content_type) == (200, "text/event-stream")
    got = events(body)
    assert [k for k, _ in got] == ["transcript.text.delta"] * 6 + ["transcript.text.done"]
    assert "".join(e["delta"] for _, e in got[:-1]) == got[-1][1]["text"] == "Hello there, world"
    assert got[-1][1]["usage"]["total_tokens"] == 27


async def test_a_worker_failing_mid_stream_ends_it_with_an_error_event(tokenizer: TextTokenizer) -> None:
    _, _, body = await answer(tokenizer, request(stream=True), failing=True)
    (delta_kind, delta), (error_kind, error) = events(body)
    assert (delta_kind, delta["delta"]) == ("transcript.text.delta", "Hel")
    assert error_kind == "error" and error["type"] == "error" and error["error"]["code"] == "service_unavailable"
