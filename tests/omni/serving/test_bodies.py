"""The response Structs encode to the bodies the API has always sent: the same keys in the same
order, a left-out field absent (not null), and a logprob of minus infinity as null."""

from __future__ import annotations

import msgspec

from omni.engines.generation import Usage as TokenUsage
from omni.serving.bodies import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatTokenLogprob,
    ChunkDelta,
    ChunkUsage,
    ImageData,
    LogprobEntry,
    TranscriptionTokenDetails,
    TranscriptionUsage,
    TranscriptTextDeltaEvent,
    usage_body,
)


def _chunk(usage: ChunkUsage = msgspec.UNSET) -> ChatCompletionChunk:
    choice = ChatChunkChoice(0, ChunkDelta(content="Hi"), None, None)
    return ChatCompletionChunk(
        id="c", object="chat.completion.chunk", created=7, model="m", choices=[choice], usage=usage
    )


def test_a_chunk_has_usage_only_when_asked() -> None:
    head = b'{"id":"c","object":"chat.completion.chunk","created":7,"model":"m",'
    choices = b'"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]'
    assert msgspec.json.encode(_chunk()) == head + choices + b"}"
    assert msgspec.json.encode(_chunk(None)) == head + choices + b',"usage":null}'
    usage = usage_body(TokenUsage(prompt_tokens=5, completion_tokens=2, cached_tokens=1))
    assert msgspec.json.decode(msgspec.json.encode(_chunk(usage)))["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 1},
    }


def test_an_empty_delta_is_an_empty_object() -> None:
    assert msgspec.json.encode(ChunkDelta()) == b"{}"
    assert msgspec.json.encode(ChunkDelta(role="assistant", content="")) == b'{"role":"assistant","content":""}'


def test_minus_infinity_is_null() -> None:
    entry = ChatTokenLogprob("a", float("-inf"), [97], [LogprobEntry("b", -1.5, [98])])
    assert msgspec.json.encode(entry) == (
        b'{"token":"a","logprob":null,"bytes":[97],"top_logprobs":[{"token":"b","logprob":-1.5,"bytes":[98]}]}'
    )


def test_an_image_is_a_url_or_its_bytes() -> None:
    assert msgspec.json.encode(ImageData(url="u")) == b'{"url":"u"}'
    assert msgspec.json.encode(ImageData(b64_json="iVBO")) == b'{"b64_json":"iVBO"}'


def test_an_event_leads_with_its_type() -> None:
    usage = TranscriptionUsage(70, TranscriptionTokenDetails(20, 50), 5, 75)
    assert msgspec.json.encode(usage).startswith(b'{"type":"tokens","input_tokens":70,')
    assert msgspec.json.encode(TranscriptTextDeltaEvent(delta="H")) == b'{"type":"transcript.text.delta","delta":"H"}'
