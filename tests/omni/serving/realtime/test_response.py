"""One realtime response on its own: the chat request a session's settings make, the vocoder's
samples in each output format, and the server events of a response, in order: text, a tool
call, a cancellation, and the usage that splits audio from text. (The session around it, over
a socket, is tests/e2e/test_realtime.py's.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from omni.engines.generation import Delta, Usage
from omni.modalities.outputs.audio import AudioPiece
from omni.serving.realtime import client_events as ev
from omni.serving.realtime.conversation import Conversation
from omni.serving.realtime.response import AudioOut, ResponseEvents, chat_body, new_response_id
from omni.text.parsers.tool_calls import ToolFunction
from omni.text.reply_parser import OutputFormat

SETTINGS: dict[str, Any] = {
    "instructions": "", "output_modalities": ["text"], "voice": "alloy", "temperature": None, "seed": None,
    "logit_bias": None, "max_output_tokens": "inf", "tools": [], "tool_choice": "auto", "parallel_tool_calls": True,
}  # fmt: skip
HI = [{"role": "user", "content": "hi"}]


def test_a_text_session_asks_for_text_without_reasoning() -> None:
    body = chat_body("m", False, SETTINGS, HI)
    assert body == {
        "model": "m",
        "messages": HI,
        "chat_template_kwargs": {"skip_reasoning": True, "enable_thinking": False},
    }
    assert chat_body("m", True, SETTINGS, HI)["modalities"] == ["text"]  # a model that speaks is told not to


def test_the_sessions_settings_become_the_chat_fields() -> None:
    tool = ev.FunctionTool(type="function", name="weather", description="Now")
    s = dict(SETTINGS, instructions="Be brief.", output_modalities=["audio"], temperature=0.6, seed=3,
             max_output_tokens=50, tools=[tool], tool_choice=ev.ToolChoiceFunction(type="function", name="weather"),
             parallel_tool_calls=False)  # fmt: skip
    body = chat_body("m", True, s, HI)
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, *HI]
    assert (body["modalities"], body["audio"]) == (["text", "audio"], {"voice": "alloy", "format": "pcm16"})
    assert (body["temperature"], body["seed"], body["max_completion_tokens"]) == (0.6, 3, 50)
    assert body["tools"] == [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}, "description": "Now"}}]
    assert (body["tool_choice"], body["parallel_tool_calls"]) == ({"type": "function", "function": {"name": "weather"}}, False)


def test_audio_out_is_pcm16_at_24k_or_g711_at_8k() -> None:
    samples = np.full(2400, 0.25, dtype=np.float32)
    pcm = AudioOut("audio/pcm").encode(samples)
    assert len(pcm) == 4800 and np.frombuffer(pcm, dtype="<i2")[0] == round(0.25 * 32767)
    assert len(AudioOut("audio/pcmu").encode(samples)) == 800  # a third of the samples, one byte each
    assert AudioOut("audio/pcma").encode(samples) != AudioOut("audio/pcmu").encode(samples)


def run(events: ResponseEvents, deltas: list[Delta], status: str = "completed", usage: Usage | None = None) -> None:
    events.created()
    for delta in deltas:
        events.push(delta)
    events.done(status, usage)


def response() -> dict[str, Any]:
    return {"id": new_response_id(), "object": "realtime.response", "status": "in_progress", "output": []}


def test_a_text_answer_is_one_message_item_added_streamed_and_done() -> None:
    sent: list[dict[str, Any]] = []
    conversation = Conversation()
    events = ResponseEvents(sent.append, response(), conversation, audio=False, audio_format="audio/pcm")
    events.parser = OutputFormat().new_parser()
    run(events, [Delta("Hel", [1]), Delta("lo", [2], finish_reason="stop")], usage=Usage(5, 2, 1))
    assert [e["type"] for e in sent] == [
        "response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "conversation.item.done", "response.done",
    ]  # fmt: skip
    assert [e["delta"] for e in sent if e["type"] == "response.output_text.delta"] == ["Hel", "lo"]
    done = sent[-1]["response"]
    (item,) = done["output"]
    assert (item["status"], item["content"]) == ("completed", [{"type": "output_text", "text": "Hello"}])
    assert [i["id"] for i in conversation.items] == [item["id"]]
    assert done["usage"] == {
        "total_tokens": 7, "input_tokens": 5, "output_tokens": 2,
        "input_token_details": {"cached_tokens": 1, "text_tokens": 5, "image_tokens": 0, "audio_tokens": 0},
        "output_token_details": {"audio_tokens": 0, "text_tokens": 2},
    }  # fmt: skip
    orjson.dumps(sent)  # every event is plain JSON


def test_the_prompts_images_and_audio_are_counted_apart_from_its_text() -> None:
    sent: list[dict[str, Any]] = []
    events = ResponseEvents(sent.append, response(), None, audio=False, audio_format="audio/pcm")
    events.parser = OutputFormat().new_parser()
    events.num_media_tokens = {"image": 80, "audio": 25}  # as chat's turn expanded them
    run(events, [Delta("Hi", [1], finish_reason="stop")], usage=Usage(120, 1, 96))
    details = sent[-1]["response"]["usage"]["input_token_details"]
    assert details == {"cached_tokens": 96, "text_tokens": 15, "image_tokens": 80, "audio_tokens": 25}


def test_spoken_audio_is_counted_in_units_and_its_item_is_output_audio() -> None:
    sent: list[dict[str, Any]] = []
    firsts: list[float] = []
    events = ResponseEvents(sent.append, response(), None, audio=True, audio_format="audio/pcm", on_first_audio=firsts.append)
    events.parser = OutputFormat().new_parser()
    piece = AudioPiece(np.zeros(960 * 3, dtype="<f4").tobytes(), 24000, 0)
    run(events, [Delta("Hi", [1], pieces={"audio": [piece]}), Delta("", [2], finish_reason="stop", pieces={"audio": [piece]})], usage=Usage(4, 10, 0))
    kinds = [e["type"] for e in sent]
    assert kinds.count("response.output_audio.delta") == 2 and len(firsts) == 1
    assert "response.output_audio_transcript.done" in kinds and "conversation.item.added" not in kinds  # out of band
    (item,) = sent[-1]["response"]["output"]
    assert item["content"] == [{"type": "output_audio", "transcript": "Hi"}]
    assert sent[-1]["response"]["usage"]["output_token_details"] == {"audio_tokens": 6, "text_tokens": 4}


def test_a_tool_call_closes_the_text_before_it_and_streams_its_arguments() -> None:
    sent: list[dict[str, Any]] = []
    events = ResponseEvents(sent.append, response(), Conversation(), audio=False, audio_format="audio/pcm")
    events.parser = OutputFormat(tool_parser="hermes", tools=(ToolFunction("weather"),)).new_parser()
    call = '<tool_call>{"name": "weather", "arguments": {"city": "Seoul"}}</tool_call>'
    run(events, [Delta("Checking.", [1]), Delta(call, [2], finish_reason="stop")])
    message, function_call = sent[-1]["response"]["output"]
    assert message["content"] == [{"type": "output_text", "text": "Checking."}]
    assert (function_call["type"], function_call["name"], orjson.loads(function_call["arguments"])) == (
        "function_call", "weather", {"city": "Seoul"},
    )  # fmt: skip
    kinds = [e["type"] for e in sent]
    assert kinds.index("response.output_text.done") < kinds.index("response.function_call_arguments.delta")
    assert (function_call["status"], "usage" in sent[-1]["response"]) == ("completed", False)  # no usage given


def test_a_cancelled_response_leaves_its_items_incomplete() -> None:
    sent: list[dict[str, Any]] = []
    events = ResponseEvents(sent.append, response(), Conversation(), audio=False, audio_format="audio/pcm")
    events.parser = OutputFormat().new_parser()
    run(events, [Delta("Half an ans", [1])], status="cancelled")
    done = sent[-1]["response"]
    assert (done["status"], done["output"][0]["status"]) == ("cancelled", "incomplete")
    assert "usage" not in done
