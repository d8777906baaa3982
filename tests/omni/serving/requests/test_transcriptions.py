"""POST /v1/audio/transcriptions: the multipart body's fields parse as OpenAI's (and the official
client's `include[]` lists), what the model cannot give (timestamps: srt, vtt,
timestamp_granularities) or a field of neither API is a 400 naming it; and the lifecycle over
HTTP with a FakePool and a fake media pipeline: the prompt, the sampling, and every response
format, streamed too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.engines.pool import ModelPool
from omni.errors import APIError
from omni.http.errors import error_middleware
from omni.http.handlers import transcriptions
from omni.http.state import MODELS
from omni.modalities.inputs.items import MediaItem
from omni.modalities.inputs.pipeline import MediaPipeline, PromptInputs
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.requests.transcriptions import (
    MAX_PROMPT_CHARS,
    TranscriptionForm,
    TranscriptionRequest,
    parse_transcription_request,
)
from omni.serving.transcriptions import TRANSCRIBE_INSTRUCTION
from omni.shared.media import MediaLimits
from omni.text.tokenizer import TextTokenizer
from scheduler.request import MediaSpan
from tests.omni.fake_pool import FakePool

WAV = b"RIFF....WAVEfmt "  # never decoded here: the fake pipeline takes any bytes
REPLY = "Hello there"
AUDIO_ROWS = 25  # the fake encoder's rows: one second of audio
MAX_FILE_BYTES = 1000
PATH = "/v1/audio/transcriptions"


def form(file: bytes | None = WAV, **fields: str | list[str]) -> TranscriptionForm:
    return TranscriptionForm({k: v if isinstance(v, list) else [v] for k, v in fields.items()}, file)


def test_defaults() -> None:
    assert parse_transcription_request(form()) == TranscriptionRequest(model=None, file=WAV)


def test_every_field() -> None:
    r = parse_transcription_request(
        form(
            model="omni",
            language="EN",
            prompt="Names: Ana, Bo.",
            response_format="json",
            temperature="0.4",
            stream="True",  # what Python's str() makes of a bool
            include=["logprobs"],
            seed="7",
        )
    )
    assert r == TranscriptionRequest(
        model="omni", file=WAV, language="en", prompt="Names: Ana, Bo.",
        temperature=0.4, stream=True, logprobs=True, seed=7,
    )  # fmt: skip
    assert parse_transcription_request(form(response_format="verbose_json")).response_format == "verbose_json"
    assert parse_transcription_request(form(response_format="text", stream="false")).stream is False
    assert parse_transcription_request(form(language="", prompt=" ")) == TranscriptionRequest(model=None, file=WAV)


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"response_format": "srt"}, "response_format", "timestamps"),
        ({"response_format": "vtt"}, "response_format", "timestamps"),
        ({"timestamp_granularities": ["segment"]}, "timestamp_granularities", "timestamps"),
        ({"timestamp_granularities": ["word", "segment"]}, "timestamp_granularities", "timestamps"),
        ({"response_format": "diarized_json"}, "response_format", "expected one of"),
        ({"response_format": "xml"}, "response_format", "expected one of"),
        ({"temperature": "1.5"}, "temperature", "between 0 and 1"),
        ({"temperature": "-0.1"}, "temperature", "between 0 and 1"),
        ({"temperature": "nan"}, "temperature", "between 0 and 1"),
        ({"temperature": "warm"}, "temperature", "a number"),
        ({"stream": "yes"}, "stream", "true or false"),
        ({"stream": "true", "response_format": "verbose_json"}, "response_format", "not streamed"),
        ({"language": "english"}, "language", "ISO-639-1"),
        ({"language": "e1"}, "language", "ISO-639-1"),
        ({"language": " en"}, "language", "ISO-639-1"),
        ({"language": "en\n"}, "language", "ISO-639-1"),
        ({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}, "prompt", "at most"),
        ({"include": ["words"]}, "include", "logprobs"),
        ({"include": ["logprobs"], "response_format": "text"}, "include", "json only"),
        ({"seed": "1.5"}, "seed", "an integer"),
        ({"seed": str(2**64)}, "seed", "between"),
        ({"chunking_strategy": "auto"}, "chunking_strategy", "one block"),
        ({"known_speaker_names": ["a"]}, "known_speaker_names", "speakers"),
        ({"keywords": ["omni"]}, "keywords", "prompt"),
        ({"languages": ["en"]}, "languages", "language"),
        ({"max_tokens": "8"}, "max_tokens", "not a field"),
        ({"language": ["en", "fr"]}, "language", "once"),
    ],
)
def test_bad_fields_are_400s_naming_them(fields: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(APIError) as e:
        parse_transcription_request(form(**fields))
    assert (e.value.status, e.value.param) == (400, param)
    assert words in e.value.message


def test_the_file_is_required_and_not_empty() -> None:
    for file in (None, b""):
        with pytest.raises(APIError) as e:
            parse_transcription_request(form(file))
        assert (e.value.status, e.value.param) == (400, "file")


# ----------------------------------------------------------------------------- over HTTP


@dataclass
class FakeMedia:
    """The media pipeline's face to the orchestrator: each audio placeholder becomes AUDIO_ROWS
    rows (a MediaSpan for the encoder's, code tokens for the tokenizer's)."""

    tokenizer: TextTokenizer
    limits: MediaLimits = field(default_factory=lambda: MediaLimits(max_bytes=MAX_FILE_BYTES))
    ready: bool = True
    encoder: Any = field(default_factory=lambda: SimpleNamespace(components=frozenset({"audio_encoder"})))
    items: list[MediaItem] = field(default_factory=list)

    async def expand(self, token_ids: list[int], items: Sequence[MediaItem], *, priority: int = 0) -> PromptInputs:
        self.items.extend(items)
        pad = self.tokenizer.token_to_id("<|AUDIO_PAD|>")
        discrete = self.tokenizer.token_to_id("<|DISCRETE_AUDIO_PAD|>")
        code = self.tokenizer.token_to_id("<|audio0000|>") or 0
        out: list[int] = []
        spans = []
        for t in token_ids:
            if t == pad:
                spans.append(MediaSpan(len(out), AUDIO_ROWS, "key"))
                out += [t] * AUDIO_ROWS
            elif t == discrete:
                out += [code] * AUDIO_ROWS
            else:
                out.append(t)
        return PromptInputs(out, tuple(spans))


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.fixture
def pool(tokenizer: TextTokenizer) -> FakePool:
    return FakePool(tokenizer.encode(REPLY, add_special_tokens=False))


@pytest.fixture
def media(tokenizer: TextTokenizer) -> FakeMedia:
    return FakeMedia(tokenizer)


def _app(tokenizer: TextTokenizer, pool: FakePool, media: FakeMedia, **app_args: Any) -> web.Application:
    app = web.Application(middlewares=[error_middleware], **app_args)
    app[MODELS] = ModelRegistry()
    app[MODELS].add(ServedModel("text", tokenizer, cast(ModelPool, FakePool([1])), created=0))
    app[MODELS].add(ServedModel("omni", tokenizer, cast(ModelPool, pool), created=0, media=cast(MediaPipeline, media)))
    app.router.add_post(PATH, transcriptions.create_transcription)
    return app


@pytest.fixture
async def client(tokenizer: TextTokenizer, pool: FakePool, media: FakeMedia) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(_app(tokenizer, pool, media))) as c:
        yield c


def upload(file: bytes | None = WAV, **fields: str | list[str]) -> aiohttp.FormData:
    data = aiohttp.FormData(default_to_multipart=True)
    for name, value in fields.items():
        for v in value if isinstance(value, list) else [value]:
            data.add_field(name, v)
    if file is not None:
        data.add_field("file", file, filename="clip.wav", content_type="audio/wav")
    return data


async def error_of(r: aiohttp.ClientResponse) -> tuple[int, str | None]:
    body = await r.json()
    return r.status, body["error"]["param"]


async def test_json_is_the_text_and_token_usage(
    client: TestClient[Any, Any], pool: FakePool, media: FakeMedia, tokenizer: TextTokenizer
) -> None:
    r = await client.post(PATH, data=upload(language="ko", prompt="Seoul"))  # no model: the only one that hears
    assert r.status == 200, await r.text()
    body = await r.json()
    [request] = pool.submitted
    prompt = len(request.prompt_token_ids)
    n = len(pool.tokens)
    assert body == {
        "text": REPLY,
        "usage": {
            "type": "tokens",
            "input_tokens": prompt,
            "input_token_details": {"text_tokens": prompt - 2 * AUDIO_ROWS, "audio_tokens": 2 * AUDIO_ROWS},
            "output_tokens": n,
            "total_tokens": prompt + n,
        },
    }
    # the upload is the media item, named `file`, its format left to FFmpeg's probe
    [item] = media.items
    assert (item.kind, item.param, item.data, item.fmt) == ("audio", "file", WAV, None)
    assert item.digest
    text = tokenizer.decode(request.prompt_token_ids, skip_special_tokens=False)
    assert f"{TRANSCRIBE_INSTRUCTION} The speech is in the language with ISO-639-1 code 'ko'." in text
    assert text.rstrip().endswith("</think>")  # reasoning off
    assert "Seoul" in text
    params = request.sampling_params
    assert params.temperature == 0.0 and params.logprobs is None
    assert params.max_tokens == 32 + 20  # one second of audio
    banned = {tokenizer.token_to_id("<|discrete_image_start|>"), tokenizer.token_to_id("<|discrete_audio_start|>")}
    assert {w[0] for w in params.bad_words_token_ids} == banned
    pad = tokenizer.token_to_id("<|AUDIO_PAD|>")
    assert pad is not None and request.media == (MediaSpan(request.prompt_token_ids.index(pad), AUDIO_ROWS, "key"),)


async def test_text_and_verbose_json(client: TestClient[Any, Any], pool: FakePool) -> None:
    r = await client.post(PATH, data=upload(model="omni", response_format="text"))
    assert r.status == 200 and r.content_type == "text/plain"
    assert await r.text() == REPLY
    r = await client.post(PATH, data=upload(model="omni", response_format="verbose_json", temperature="0.5"))
    body = await r.json()
    segment = body.pop("segments")
    assert body == {
        "task": "transcribe",
        "language": "unknown",
        "duration": 1.0,
        "text": REPLY,
        "usage": {"type": "duration", "seconds": 1.0},
    }
    assert len(segment) == 1
    assert segment[0].pop("compression_ratio") > 0
    assert segment[0] == {
        "id": 0,
        "seek": 0,
        "start": 0.0,
        "end": 1.0,
        "text": REPLY,
        "tokens": pool.tokens,
        "temperature": 0.5,
        "avg_logprob": -0.5,  # the fake pool's
        "no_speech_prob": 0.0,
    }
    assert pool.submitted[-1].sampling_params.logprobs == 0


async def test_stream_sends_deltas_then_done(client: TestClient[Any, Any], pool: FakePool) -> None:
    r = await client.post(PATH, data=upload(stream="true", include=["logprobs"]))
    assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
    events = []
    for block in (await r.text()).split("\n\n")[:-1]:  # each named by its type, no [DONE] after
        name, data = block.split("\n")
        events.append(orjson.loads(data.removeprefix("data: ")))
        assert name == f"event: {events[-1]['type']}"
    *deltas, done = events
    assert {d["type"] for d in deltas} == {"transcript.text.delta"} and deltas
    assert done["type"] == "transcript.text.done"
    assert done["text"] == "".join(d["delta"] for d in deltas) == REPLY
    assert done["usage"]["output_tokens"] == len(pool.tokens)
    assert [e["logprob"] for d in deltas for e in d["logprobs"]] == [-0.5] * len(pool.tokens)
    assert done["logprobs"] == [e for d in deltas for e in d["logprobs"]]


@pytest.mark.parametrize(
    "data, param",
    [
        (upload(None, model="omni"), "file"),
        (upload(model="text"), "model"),
        (upload(model="omni", temperature="3"), "temperature"),
        (upload(model="omni", response_format="srt"), "response_format"),
        (upload(timestamp_granularities=["word"]), "timestamp_granularities"),
    ],
)
async def test_bad_uploads_name_the_field(client: TestClient[Any, Any], data: aiohttp.FormData, param: str) -> None:
    status, got = await error_of(await client.post(PATH, data=data))
    assert (status, got) == (400, param)


async def test_an_oversized_file_is_a_413_and_a_missing_one_a_400(client: TestClient[Any, Any]) -> None:
    assert await error_of(await client.post(PATH, data=upload(b"x" * (MAX_FILE_BYTES + 1)))) == (413, "file")
    assert await error_of(await client.post(PATH, data=upload(None))) == (400, "file")


async def test_not_multipart_is_a_400(client: TestClient[Any, Any]) -> None:
    for kwargs in ({"json": {"model": "omni"}}, {"data": b"--x\r\nnot a form"}):
        r = await client.post(PATH, **kwargs)
        assert r.status == 400
        assert "multipart/form-data" in (await r.json())["error"]["message"]
    r = await client.post(PATH, data=b"garbage", headers={"Content-Type": "multipart/form-data; boundary=xyz"})
    assert r.status == 400  # no part: not even the file
    # a part whose header line is no header (aiohttp raises its own HTTP error: found by the fuzzer)
    r = await client.post(PATH, data=b"--B\r\n[]--B--\r\n", headers={"Content-Type": "multipart/form-data; boundary=B"})
    assert r.status == 400 and "malformed" in (await r.json())["error"]["message"]


async def test_a_body_over_the_request_bound_is_a_413(
    tokenizer: TextTokenizer, pool: FakePool, media: FakeMedia
) -> None:
    async with TestClient(TestServer(_app(tokenizer, pool, media, client_max_size=400))) as c:
        r = await c.post(PATH, data=upload(b"x" * 600))
        assert r.status == 413


async def test_encoders_starting_is_a_503_and_no_audio_encoder_a_400_naming_model(
    client: TestClient[Any, Any], media: FakeMedia
) -> None:
    media.ready = False
    assert (await client.post(PATH, data=upload())).status == 503
    media.ready = True
    media.encoder = SimpleNamespace(components=frozenset({"vision_encoder"}))
    assert await error_of(await client.post(PATH, data=upload())) == (400, "model")


def test_priority_is_read_from_its_form_text() -> None:
    assert parse_transcription_request(form()).priority == 0
    assert parse_transcription_request(form(priority="-1")).priority == -1
    with pytest.raises(APIError) as e:
        parse_transcription_request(form(priority=str(2**31)))
    assert e.value.param == "priority"
