"""Client events: each type parses to its Struct; an unknown type, an unknown field or a bad
value is an EventError naming the event (type, event_id) and the field."""

from __future__ import annotations

import orjson
import pytest

from omni.serving.realtime import client_events as ev


def test_a_session_update_with_turn_detection_null() -> None:
    e = ev.parse_event(orjson.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}))
    assert isinstance(e, ev.SessionUpdate) and e.session.audio.input.turn_detection is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("event", "param"),
    [
        ({"type": "nope", "event_id": "e"}, "type"),
        ({"type": "session.update", "event_id": "e", "session": {"voices": "x"}}, "session.voices"),
        ({"type": "conversation.item.truncate", "event_id": "e", "item_id": "i", "content_index": 0, "audio_end_ms": -1}, "audio_end_ms"),
        ({"type": "session.update", "event_id": "e", "session": {"audio": {"output": {"speed": 1.5}}}}, "session.audio.output.speed"),
    ],
)
def test_bad_events_name_the_event_and_field(event: dict[str, object], param: str) -> None:
    with pytest.raises(ev.EventError) as e:
        ev.parse_event(orjson.dumps(event))
    assert (e.value.event_type, e.value.event_id, e.value.error.param) == (event["type"], "e", param)


def test_not_json_is_an_error_too() -> None:
    with pytest.raises(ev.EventError) as e:
        ev.parse_event(b"{")
    assert e.value.error.code == "invalid_json"


def _turn_detection(value: object) -> object:
    e = ev.parse_event(orjson.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": value}}}}))
    assert isinstance(e, ev.SessionUpdate)
    return e.session.audio.input.turn_detection  # type: ignore[union-attr]


def test_turn_detection_is_server_or_semantic_vad_by_its_type() -> None:
    assert _turn_detection({"type": "server_vad", "silence_duration_ms": 400}) == ev.ServerVad(silence_duration_ms=400)
    # openai-agents' RealtimeRunner sends this by default
    assert _turn_detection({"type": "semantic_vad", "interrupt_response": True}) == ev.SemanticVad(eagerness="auto")
    assert _turn_detection({"type": "semantic_vad", "eagerness": "low", "create_response": False}) == ev.SemanticVad(
        eagerness="low", create_response=False
    )


@pytest.mark.parametrize(
    ("value", "param", "words"),
    [
        ({"type": "vad"}, "session.audio.input.turn_detection.type", "'vad'"),
        ({"type": "semantic_vad", "eagerness": "eager"}, "session.audio.input.turn_detection.eagerness", "'eager'"),
        ({"type": "semantic_vad", "silence_duration_ms": 500}, "session.audio.input.turn_detection.silence_duration_ms", ""),
    ],
)
def test_bad_turn_detection_names_its_field(value: dict[str, object], param: str, words: str) -> None:
    with pytest.raises(ev.EventError) as e:
        _turn_detection(value)
    assert e.value.error.param == param and words in e.value.error.message, e.value.error.message


def test_a_user_item_takes_input_image_parts_as_the_openai_client_sends_them() -> None:
    url = "data:image/png;base64,iVBORw0KGgo="
    item = {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "What is it?"}, {"type": "input_image", "image_url": url, "detail": "high"}]}  # fmt: skip
    e = ev.parse_event(orjson.dumps({"type": "conversation.item.create", "item": item}))
    assert isinstance(e, ev.ItemCreate) and isinstance(e.item, ev.MessageItem)
    assert e.item.content[1] == ev.InputImage(image_url=url, detail="high")
    bare = ev.parse_event(orjson.dumps({"type": "conversation.item.create", "item": dict(item, content=[{"type": "input_image", "image_url": url}])}))
    assert bare.item.content[0].detail == "auto"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("part", "param"),
    [({"type": "input_image"}, "item.content[0].image_url"),
     ({"type": "input_image", "image_url": "data:,", "detail": "max"}, "item.content[0].detail")],
)  # fmt: skip
def test_a_bad_input_image_part_names_its_field(part: dict[str, object], param: str) -> None:
    event = {"type": "conversation.item.create", "event_id": "e", "item": {"type": "message", "role": "user", "content": [part]}}
    with pytest.raises(ev.EventError) as e:
        ev.parse_event(orjson.dumps(event))
    assert e.value.error.param == param
