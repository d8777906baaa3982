"""The conversation's items as chat messages, insertion by previous_item_id, and truncation."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
import pytest

from omni.errors import APIError
from omni.serving.realtime.conversation import Conversation, wav_bytes


def _msg(item_id: str, role: str, part: dict[str, object]) -> dict[str, object]:
    return {"id": item_id, "type": "message", "role": role, "content": [part]}


def test_items_render_as_chat_messages_in_order() -> None:
    c = Conversation()
    c.add(_msg("u1", "user", {"type": "input_audio", "transcript": None}))
    c.set_user_audio("u1", 0, b"RIFF")
    c.add({"id": "f1", "type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"})
    c.add({"id": "f2", "type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"})
    c.add({"id": "o1", "type": "function_call_output", "call_id": "c1", "output": "ok"})
    assert c.add(_msg("s0", "system", {"type": "input_text", "text": "Be brief."}), "root") is None
    assert c.add(_msg("a1", "assistant", {"type": "output_audio", "transcript": "hello there"}), "o1") == "o1"
    assert c.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF").decode(), "format": "wav"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "hello there"},
    ]  # fmt: skip


def test_an_image_renders_as_chats_image_url_of_its_loaded_bytes_until_its_item_goes() -> None:
    c = Conversation()
    c.add(_msg("u1", "user", {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "auto"}))
    c.items[0]["content"].append({"type": "input_text", "text": "What is it?"})
    c.set_user_image("u1", 0, "data:image/png;base64,AAAA")  # what input_image.py loaded from the URL
    assert c.messages() == [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, {"type": "text", "text": "What is it?"}]}]  # fmt: skip
    c.delete("u1")
    assert (c.items, c._images) == ([], {})


def test_past_the_most_media_a_request_takes_the_oldest_audio_renders_as_its_transcript() -> None:
    """A spoken session of more turns than max_items_per_request keeps answering: its oldest user
    audio renders as its transcript (its message left out with none: chat refuses an empty
    one), the newest max_media as audio."""
    c = Conversation()
    for n, transcript in enumerate(("first", None, "third", "fourth")):
        c.add(_msg(f"u{n}", "user", {"type": "input_audio", "transcript": transcript}))
        c.set_user_audio(f"u{n}", 0, f"RIFF{n}".encode())

    def audio(n: int) -> dict[str, object]:
        return {"type": "input_audio", "input_audio": {"data": base64.b64encode(f"RIFF{n}".encode()).decode(), "format": "wav"}}

    assert c.messages(max_media=2) == [
        {"role": "user", "content": [{"type": "text", "text": "first"}]},  # (the second: no transcript, no message)
        {"role": "user", "content": [audio(2)]},
        {"role": "user", "content": [audio(3)]},
    ]
    assert c.messages(max_media=4) == c.messages() == [{"role": "user", "content": [audio(n)]} for n in range(4)]
    # an image counts against the cap too: one more audio turn renders as its transcript
    c.add(_msg("u4", "user", {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}))
    c.set_user_image("u4", 0, "data:image/png;base64,AAAA")
    assert c.messages(max_media=4)[:2] == [
        {"role": "user", "content": [{"type": "text", "text": "first"}]},
        {"role": "user", "content": [audio(1)]},
    ]


def test_truncate_keeps_the_heard_share_of_the_transcript() -> None:
    c = Conversation()
    c.add(_msg("a1", "assistant", {"type": "output_audio", "transcript": "one two three four"}))
    c.set_spoken_ms("a1", 0, 2000)
    with pytest.raises(APIError) as past:
        c.truncate("a1", 0, 2500)
    assert past.value.param == "audio_end_ms"
    c.truncate("a1", 0, 1000)
    assert c.messages() == [{"role": "assistant", "content": "one two"}]


def test_unknown_ids_and_duplicates_are_errors_naming_them() -> None:
    c = Conversation()
    c.add(_msg("u1", "user", {"type": "input_text", "text": "hi"}))
    for call, param in ((lambda: c.get("nope"), "item_id"), (lambda: c.add(_msg("x", "user", {}), "nope"), "previous_item_id"),
                        (lambda: c.add(_msg("u1", "user", {})), "item.id")):  # fmt: skip
        with pytest.raises(APIError) as e:
            call()
        assert e.value.param == param
    c.delete("u1")
    assert c.items == []


def test_wav_bytes_hold_the_samples() -> None:
    samples = np.array([0, 1000, -1000, 32767], dtype=np.int16)
    with wave.open(io.BytesIO(wav_bytes(samples, 8000))) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (8000, 1, 2)
        assert np.array_equal(np.frombuffer(w.readframes(4), dtype="<i2"), samples)
