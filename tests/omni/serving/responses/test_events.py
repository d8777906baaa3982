"""The events of a Responses turn, each validated by the openai package's own models (its
ResponseStreamEvent union, strictly): the item order, the sequence numbers, the final
Response, and a drawing call that becomes an image_generation_call."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any, cast

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from omni.engines.generation import Delta, Usage
from omni.modalities.outputs.image import IMAGE, GeneratedImage, ImagePreview
from omni.serving.model import ServedModel
from omni.serving.requests.responses import parse_response_request
from omni.serving.responses.events import ResponseEvents
from omni.serving.responses.turn import response_turn
from omni.text.parsers.tool_calls import ToolFunction
from omni.text.reply_parser import OutputFormat

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
WEATHER = ToolFunction("get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}})


def _response() -> dict[str, Any]:
    return {
        "id": "resp_1", "object": "response", "created_at": 1, "status": "in_progress", "error": None,
        "incomplete_details": None, "instructions": None, "model": "m", "output": [], "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [], "temperature": 1.0, "top_p": 1.0, "metadata": {}, "usage": None,
    }  # fmt: skip


def _run(events: ResponseEvents, deltas: list[Delta], finish: str = "stop", previews: tuple[ImagePreview, ...] = ()) -> list[Any]:
    out = events.start()
    for delta in deltas:
        if IMAGE.pieces(delta):
            for preview in previews:
                out += events.preview(preview)
        out += events.push(delta)
    out += events.finish(finish, Usage(prompt_tokens=10, completion_tokens=len(deltas), cached_tokens=4))
    return [EVENTS.validate_python(e, strict=False) for e in out]


def _deltas(*texts: str, last: str = "stop") -> list[Delta]:
    return [Delta(t, [i], finish_reason=last if i == len(texts) - 1 else None) for i, t in enumerate(texts)]


def test_reasoning_then_text() -> None:
    events = ResponseEvents(_response(), OutputFormat(reasoning_parser="think", in_reasoning=True), t2i_call=False)
    parsed = _run(events, _deltas("weigh", " it</think>", "\n\nHello", " there"))
    kinds = [e.type for e in parsed]
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    final = Response.model_validate(events.response)
    assert final.output_text == "Hello there" and final.status == "completed"
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].summary[0].text == "weigh it"  # type: ignore[union-attr]
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens == 4
    assert events.assistant_message() == {"role": "assistant", "content": "Hello there", "reasoning_content": "weigh it"}


def test_a_function_call_cut_by_the_length_is_incomplete() -> None:
    fmt = OutputFormat(tool_parser="hermes", tools=(WEATHER,))
    events = ResponseEvents(_response(), fmt, t2i_call=False)
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    parsed = _run(events, _deltas(*text.split(" "), last="length"), finish="length")
    kinds = [e.type for e in parsed]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.incomplete"
    final = Response.model_validate(events.response)
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "incomplete"
    assert final.incomplete_details is not None and final.incomplete_details.reason == "max_output_tokens"
    assert "".join(e.delta for e in parsed if e.type == "response.function_call_arguments.delta") == call.arguments


def test_a_turn_whose_second_call_was_cut_is_followed_up() -> None:
    """previous_response_id: the stored turn holds both calls as the model wrote them (the cut
    one incomplete); the follow-up with the whole call's output renders, the cut call left out
    of its prompt (omni/serving/requests/chat.py _arguments)."""
    events = ResponseEvents(_response(), OutputFormat(tool_parser="hermes", tools=(WEATHER,)), t2i_call=False)
    whole = '<tool_call>{"name": "get_weather", "arguments": {"city": "Seoul"}}</tool_call>'
    cut = '<tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    _run(events, _deltas(whole, cut, last="length"), finish="length")
    first, second = Response.model_validate(events.response).output
    assert (first.status, second.status, second.arguments) == ("completed", "incomplete", '{"city": "Par')  # type: ignore[union-attr]
    history = [{"role": "user", "content": "Weather?"}, events.assistant_message()]
    req = parse_response_request({"model": "m", "previous_response_id": "resp_1",
                                  "input": [{"type": "function_call_output", "call_id": first.call_id, "output": "3C"}]})  # type: ignore[union-attr]  # fmt: skip
    model = cast(ServedModel, SimpleNamespace(name="m", output=lambda kind: None, chat_format=SimpleNamespace(tool_parser="hermes")))
    messages = response_turn(model, req, history).chat.template_messages
    assert [c["id"] for c in messages[1]["tool_calls"]] == [first.call_id]  # type: ignore[union-attr]
    assert messages[2] == {"role": "tool", "content": "3C", "tool_call_id": first.call_id}  # type: ignore[union-attr]


@pytest.mark.parametrize("image_first", [True, False])
def test_a_drawing_call_is_an_image_generation_call(image_first: bool) -> None:
    """The reference's t2i_model_generation call: its image, whether the parser names the call
    before the image is drawn or after, is one image_generation_call and no function call."""
    t2i = ToolFunction("t2i_model_generation", parameters={"type": "object"})
    events = ResponseEvents(_response(), OutputFormat(tool_parser="hermes", tools=(t2i,)), t2i_call=True)
    png = b"\x89PNG-bytes"
    image = GeneratedImage("data:image/png;base64,x", 768, 768, data=png, blocks_computed=60, blocks_skipped=12)
    head = '<tool_call>{"name": "t2i_model_generation", "arguments": {"discrete_image_token": "'
    deltas = [Delta(head, [1]), Delta('data:..."}}</tool_call>', [2], finish_reason="stop")]
    IMAGE.add(deltas[0 if image_first else 1], image)
    preview = ImagePreview(0, 0, b"preview", "768x768")
    parsed = _run(events, deltas, previews=(preview,))
    kinds = [e.type for e in parsed if e.type.startswith("response.image_generation_call")]
    assert kinds == [
        "response.image_generation_call.in_progress", "response.image_generation_call.generating",
        "response.image_generation_call.partial_image", "response.image_generation_call.completed",
    ]  # fmt: skip
    final = Response.model_validate(events.response)
    (item,) = final.output
    assert item.type == "image_generation_call" and item.status == "completed"
    assert base64.b64decode(item.result or "") == png
    assert events.assistant_message()["content"] == "" and "tool_calls" not in events.assistant_message()
    # ours, as the images API's usage: the decoder's work for the image (and the completed event's)
    assert events.response["usage"]["decoder_details"] == {"blocks_computed": 60, "blocks_skipped": 12}
    assert parsed[-1].type == "response.completed" and parsed[-1].response.usage is not None


def test_a_turn_that_drew_nothing_has_no_decoder_details() -> None:
    events = ResponseEvents(_response(), OutputFormat(), t2i_call=False)
    _run(events, _deltas("Hello"))
    assert "decoder_details" not in events.response["usage"]


def test_a_failure_ends_with_error_and_failed() -> None:
    events = ResponseEvents(_response(), OutputFormat(), t2i_call=False)
    out = events.start() + events.push(Delta("Hel", [1])) + events.fail("server_error", "the worker died")
    parsed = [EVENTS.validate_python(e) for e in out]
    assert [e.type for e in parsed][-3:] == ["response.output_item.done", "error", "response.failed"]
    assert Response.model_validate(events.response).status == "failed"
