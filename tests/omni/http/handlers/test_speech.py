"""POST /v1/audio/speech over HTTP: the file's bytes as the vocoder's chunks are encoded (here
pcm16, so the bytes are the samples exactly), the same bytes as base64 in speech.audio.delta
events then speech.audio.done with the usage, and a vocoder or worker failing before the first
byte a 503. The model samples units by the span grammar (SamplingPool); the fake vocoder's
samples are the units themselves."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.engines.audio_decoder import AudioDecoderEngine
from omni.engines.llm import EngineError
from omni.engines.pool import ModelPool
from omni.http.app import add_routes
from omni.http.errors import error_middleware
from omni.http.state import MODELS
from omni.modalities.outputs.audio import ModelAudio
from omni.serving.model import ModelRegistry, ServedModel
from omni.shared import protocol
from omni.shared.media.audio_encoding import float_to_pcm16
from omni.shared.store.local import LocalStore
from omni.text.tokenizer import TextTokenizer
from scheduler.request import Request
from tests.omni.fake_pool import FakeStream, SamplingPool
from tests.omni.modalities.outputs.fake_vocoder import VOICES, FakeDecoder


class Vocoder(FakeDecoder):
    def check_room(self) -> None:
        pass


@dataclass
class BrokenPool(SamplingPool):
    """Its worker fails before the first token."""

    def submit(self, request: Request, constraint: object = None) -> FakeStream:
        stream = super().submit(request, constraint)

        class Failing(FakeStream):
            async def __aiter__(self):  # type: ignore[no-untyped-def,override]
                raise EngineError("llm worker failed: gone")
                yield  # an async generator

        return Failing(stream.request, stream.events)


async def client_for(tiny_tokenizer_dir: Path, tmp_path: Path, pool: SamplingPool) -> tuple[TestClient[Any, Any], Vocoder]:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    vocoder = Vocoder(info=protocol.AudioDecoderReady(0, "cpu", 24000, 960, 64, list(VOICES), False))
    audio = ModelAudio.for_model(cast(AudioDecoderEngine, vocoder), tokenizer, LocalStore(tmp_path, "", b"s"))
    model = ServedModel("talker", tokenizer, cast(ModelPool, pool), created=0, outputs=(audio,))
    app = web.Application(middlewares=[error_middleware])
    app[MODELS] = ModelRegistry()
    app[MODELS].add(model)
    add_routes(app)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client, vocoder


@pytest.fixture
async def served(tiny_tokenizer_dir: Path, tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], Vocoder]]:
    client, vocoder = await client_for(tiny_tokenizer_dir, tmp_path, SamplingPool([1], eos_token_ids=frozenset({1282})))
    yield client, vocoder
    await client.close()


def spoken(vocoder: Vocoder) -> bytes:
    """What the vocoder was sent, as the pcm16 bytes of its samples (the units)."""
    (sink,) = vocoder.sinks
    units = [u for chunk, _ in sink.chunks for u in chunk]
    assert 3 <= len(units) <= 10 and sink.chunks[-1][1]  # a whole span, its last chunk marked
    return float_to_pcm16(np.asarray(units, dtype=np.float32))


async def test_the_file_is_the_encoded_samples(served: tuple[TestClient[Any, Any], Vocoder]) -> None:
    client, vocoder = served
    r = await client.post("/v1/audio/speech", json={"input": "Hi.", "voice": "nara", "response_format": "pcm", "seed": 4, "max_units": 10})
    assert r.status == 200 and r.headers["Content-Type"] == "audio/pcm"
    assert await r.read() == spoken(vocoder)
    assert vocoder.opened == [(2, None)]


async def test_sse_sends_the_same_bytes_as_deltas_then_the_usage(served: tuple[TestClient[Any, Any], Vocoder]) -> None:
    client, vocoder = served
    body = {"input": "Hi.", "voice": "alloy", "response_format": "pcm", "seed": 4, "max_units": 10, "stream_format": "sse"}
    r = await client.post("/v1/audio/speech", json=body)
    assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
    events = []
    for block in (await r.text()).split("\n\n"):
        if block:
            kind, data = block.split("\n")
            events.append((kind.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    *deltas, (done_kind, done) = events
    assert {k for k, _ in deltas} == {"speech.audio.delta"} and done_kind == "speech.audio.done"
    assert b"".join(base64.b64decode(e["audio"]) for _, e in deltas) == spoken(vocoder)
    usage = done["usage"]
    assert usage["output_tokens"] == len(spoken(vocoder)) // 2 + 1  # the units and the span's end
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


async def test_a_failure_before_the_first_byte_is_a_503(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    client, _ = await client_for(tiny_tokenizer_dir, tmp_path, BrokenPool([1]))
    try:
        r = await client.post("/v1/audio/speech", json={"input": "Hi.", "voice": "nara"})
        assert r.status == 503
        assert (await r.json())["error"]["message"] == "llm worker failed: gone"
    finally:
        await client.close()


async def test_a_bad_body_is_a_400_before_any_work(served: tuple[TestClient[Any, Any], Vocoder]) -> None:
    client, vocoder = served
    r = await client.post("/v1/audio/speech", json={"input": "Hi.", "voice": "nara", "speed": 9})
    assert r.status == 400 and (await r.json())["error"]["param"] == "speed"
    assert vocoder.sinks == []
