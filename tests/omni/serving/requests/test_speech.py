"""The speech API's body: OpenAI's fields with their bounds and defaults, the extensions (seed,
max_units, reference_audio), and a 400 naming whatever is wrong."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from omni.errors import APIError
from omni.serving.requests.speech import parse_speech_request


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "Hello.", "voice": "alloy", **fields}


def refused(fields: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as e:
        parse_speech_request(fields)
    assert e.value.status == 400
    return e.value


def test_the_defaults_are_openais() -> None:
    req = parse_speech_request(body())
    assert (req.voice, req.response_format, req.speed, req.stream_format) == ("alloy", "mp3", 1.0, "audio")
    assert (req.seed, req.max_units, req.reference_audio, req.reference_format, req.instructions) == (None, 2000, None, None, None)


def test_a_voice_may_be_a_name_or_an_id_object() -> None:
    assert parse_speech_request(body(voice={"id": "nara"})).voice == "nara"


def test_a_reference_recording_gives_the_voice() -> None:
    wav = b"RIFF....WAVE"
    req = parse_speech_request({"input": "Hi", "reference_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}})
    assert (req.voice, req.reference_audio, req.reference_format, req.model) == ("", wav, "wav", None)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "   "}, "input"),
        ({"input": "x" * 4097}, "input"),
        ({"voice": None}, "voice"),
        ({"speed": 0.2}, "speed"),
        ({"speed": 4.5}, "speed"),
        ({"response_format": "ogg"}, "response_format"),
        ({"stream_format": "chunks"}, "stream_format"),
        ({"max_units": 2}, "max_units"),
        ({"max_units": 2001}, "max_units"),
        ({"seed": 2**64}, "seed"),  # past the widest seed any client sends
        ({"reference_audio": {"data": "not base64!"}}, "reference_audio.data"),
        ({"reference_audio": {"data": "", "format": "wav"}}, "reference_audio.data"),
        ({"temperature": 0.5}, "temperature"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    sent = body(**fields)
    if sent.get("voice") is None:
        del sent["voice"]
    assert refused(sent).param == param


def test_the_boundaries_are_accepted() -> None:
    req = parse_speech_request(body(speed=0.25, max_units=3, input="x" * 4096, seed=-(2**63), stream_format="sse"))
    assert (req.speed, req.max_units, req.seed, req.stream_format) == (0.25, 3, -(2**63), "sse")
    assert parse_speech_request(body(speed=4.0, max_units=2000)).speed == 4.0


def test_priority_left_out_is_the_servers_voice_default_and_is_bounded() -> None:
    assert parse_speech_request(body()).priority is None  # --voice-priority decides (omni/serving/sampling.py)
    assert parse_speech_request(body(priority=-(2**31))).priority == -(2**31)
    for bad in (2**31, 1.5, "high"):
        assert refused(body(priority=bad)).param == "priority"
