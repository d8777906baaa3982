"""The Responses API end to end, with the official openai client (responses.create, retrieve,
delete, cancel) against the embedded default's layout: text streamed and not, a function call
round trip through previous_response_id (the follow-up hits the prefix cache), json_schema
output, the image_generation tool, an input image, the stored responses and the 400s.

The tiny model is random: its template opens a <think> block it never closes, so the turns
here ask reasoning effort "none" (the template's skip_reasoning), as a client that wants no
reasoning would."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from PIL import Image

from tests.e2e.server import PROCESSES, workers_held

MODEL = "omni"
NO_REASONING: Any = {"effort": "none"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def server(speaking_server: str) -> str:
    return speaking_server  # the session's omni server (tests/e2e/conftest.py)


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def _png(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return image


def _png_url(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (20, 120, 200)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_text_streamed_and_not_is_the_same_for_a_seed(client: openai.OpenAI) -> None:
    body: Any = {"model": MODEL, "input": "Say hello.", "reasoning": NO_REASONING, "max_output_tokens": 12,
                 "extra_body": {"seed": 7}}  # fmt: skip
    whole = client.responses.create(**body)
    assert whole.output_text and whole.usage is not None
    # the random model may draw its end token within the 12 (completed) or not (incomplete,
    # at exactly the cap): each status has its own token count, and the stream ends the same
    if whole.status == "incomplete":
        assert whole.incomplete_details is not None and whole.incomplete_details.reason == "max_output_tokens"
        assert whole.usage.output_tokens == 12
    else:
        assert whole.status == "completed" and whole.incomplete_details is None
        assert 1 <= whole.usage.output_tokens <= 12
    events = list(client.responses.create(**body, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{whole.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert {"response.output_item.added", "response.content_part.added", "response.output_text.done"} <= set(kinds)
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == whole.output_text
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == whole.output_text


def test_a_function_call_round_trip_reuses_the_prefix_cache(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required", parallel_tool_calls=False, reasoning=NO_REASONING, max_output_tokens=64,
        extra_body={"seed": 3},
    )  # fmt: skip
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)
    follow = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[WEATHER], reasoning=NO_REASONING,  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}],
        max_output_tokens=8, tool_choice="none",
    )  # fmt: skip
    assert follow.previous_response_id == first.id
    assert follow.usage is not None and first.usage is not None
    assert follow.usage.input_tokens > first.usage.input_tokens  # the earlier turns are in the prompt
    assert follow.usage.input_tokens_details.cached_tokens > 0


def _no_object(arguments: str) -> bool:
    try:
        return not isinstance(json.loads(arguments), dict)
    except ValueError:
        return True


def test_a_call_cut_by_max_output_tokens_is_followed_up(client: openai.OpenAI) -> None:
    """Issue 37: the stored turn holds a call the length limit cut (its arguments no JSON); the
    follow-up with its output answers, the cut call left out of the prompt, not refused."""
    for limit in range(4, 24):
        first = client.responses.create(
            model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="required", reasoning=NO_REASONING, max_output_tokens=limit, extra_body={"seed": 3},
        )  # fmt: skip
        calls = [item for item in first.output if item.type == "function_call"]
        if calls and _no_object(calls[-1].arguments):
            break
    else:
        pytest.fail("no limit cut a call in its arguments")
    assert (first.status, calls[-1].status) == ("incomplete", "incomplete")
    follow = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[WEATHER], reasoning=NO_REASONING,  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": calls[-1].call_id, "output": '{"error": "cut"}'}],
        max_output_tokens=4, tool_choice="none",
    )  # fmt: skip
    assert follow.status in ("completed", "incomplete") and follow.output_text


def test_json_schema_output_validates(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    out = client.responses.create(
        model=MODEL, input="A person as JSON.", reasoning=NO_REASONING, max_output_tokens=200,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
        extra_body={"seed": 5},
    )  # fmt: skip
    jsonschema.validate(json.loads(out.output_text), schema)


def test_image_generation_returns_a_png_of_the_asked_size_with_partials_streamed(client: openai.OpenAI) -> None:
    """The server draws in 2 steps: 2 partial images ask for one preview, after the first step.
    The usage's decoder_details are the images API's for the same seed, size and steps (2 steps
    leave the step cache nothing to skip), on the response.completed event's response too."""
    tool: Any = {"type": "image_generation", "size": "880x656", "partial_images": 2, "step_cache_threshold": 1000}
    body: Any = {"model": MODEL, "input": "Draw a kite.", "tools": [tool], "tool_choice": {"type": "image_generation"},
                 "reasoning": NO_REASONING, "max_output_tokens": 300, "extra_body": {"seed": 2}}  # fmt: skip
    whole = client.responses.create(**body)
    (call,) = [item for item in whole.output if item.type == "image_generation_call"]
    assert call.status == "completed" and call.result is not None
    image = base64.b64decode(call.result)
    assert _png(image).size == (880, 656)
    assert whole.usage is not None and whole.usage.model_extra is not None
    blocks = whole.usage.model_extra["decoder_details"]
    drawn = client.images.generate(model=MODEL, prompt="a kite", size="880x656", extra_body={"seed": 2})  # type: ignore[arg-type]
    assert drawn.usage is not None and drawn.usage.model_extra is not None
    assert blocks == drawn.usage.model_extra["decoder_details"] and blocks["blocks_computed"] > 0
    events = list(client.responses.create(**body, stream=True))
    (completed,) = [e.response for e in events if e.type == "response.completed"]
    assert completed.usage is not None and completed.usage.model_extra == {"decoder_details": blocks}
    kinds = [e.type for e in events]
    assert "response.image_generation_call.partial_image" in kinds
    order = [k for k in kinds if k.startswith("response.image_generation_call.")]
    assert order[0] == "response.image_generation_call.in_progress" and order[-1] == "response.image_generation_call.completed"
    (done,) = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "image_generation_call"]
    assert base64.b64decode(done.result) == image  # the same seed draws the same bytes
    partial = next(e for e in events if e.type == "response.image_generation_call.partial_image")
    assert _png(base64.b64decode(partial.partial_image_b64)).size == (880, 656)


def test_an_input_image_is_seen(client: openai.OpenAI) -> None:
    def tokens(content: list[dict[str, Any]]) -> int:
        out = client.responses.create(
            model=MODEL, input=[{"role": "user", "content": content}], reasoning=NO_REASONING,  # type: ignore[misc,list-item]
            max_output_tokens=1,
        )  # fmt: skip
        assert out.usage is not None
        return out.usage.input_tokens

    text = [{"type": "input_text", "text": "What is this?"}]
    plain = tokens(text)
    picture = _png_url(56, 56)
    with_image = tokens([{"type": "input_image", "image_url": picture}, *text])
    as_file = tokens([{"type": "input_file", "file_data": picture, "filename": "a.png"}, *text])
    assert with_image > plain and as_file == with_image


def test_retrieve_delete_cancel_and_unknown_ids(server: str, client: openai.OpenAI) -> None:
    made = client.responses.create(model=MODEL, input="Hi", reasoning=NO_REASONING, max_output_tokens=2)
    got = client.responses.retrieve(made.id)
    assert got.id == made.id and got.output_text == made.output_text
    client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete("resp_unknown")
    # held, the workers take no step, so the run cannot end before the cancel reaches it
    with workers_held(PROCESSES[server].pid):
        queued = client.responses.create(model=MODEL, input="Hi", background=True, reasoning=NO_REASONING,
                                         max_output_tokens=200)  # fmt: skip
        assert queued.status == "queued" and queued.background
        cancelled = client.responses.cancel(queued.id)
        assert cancelled.status == "cancelled"
        assert client.responses.retrieve(queued.id).status == "cancelled"
    assert client.responses.retrieve(queued.id).status == "cancelled"  # released, it stays so
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_unknown")


CORRUPT_PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64).decode()
BAD = {
    "unknown item type": ({"input": [{"type": "computer_call", "id": "x"}]}, "input[0].type"),
    "bad image": (
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                                {"type": "input_image", "image_url": CORRUPT_PNG}]}]},  # fmt: skip
        "input[0].content[1]",
    ),
    "unknown tool type": ({"input": "hi", "tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
    "unknown previous response": ({"input": "hi", "previous_response_id": "resp_gone"}, "previous_response_id"),
    "a field we cannot honour": ({"input": "hi", "max_tool_calls": 2}, "max_tool_calls"),
    "a pdf file": (
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_data": "data:application/pdf;base64,JVBERg=="}]}]},
        "input[0].content[0].file_data",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_a_400_naming_the_field(server: str, case: str) -> None:
    body, param = BAD[case]
    r = httpx.post(f"{server}/v1/responses", json={"model": MODEL, **body}, timeout=120)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


@pytest.mark.parametrize(
    ("field", "value", "status"),
    [("quality", "high", 400), ("moderation", "low", 400), ("background", "transparent", 400), ("model", "gpt-image-1", 404)],
)
def test_the_image_tool_refuses_what_the_images_api_refuses_with_its_error(server: str, field: str, value: str, status: int) -> None:
    """The same status, code and message as /v1/images/generations for the same value, named at
    the tool's field."""
    images = httpx.post(f"{server}/v1/images/generations", json={"model": MODEL, "prompt": "a kite", field: value}, timeout=120)
    tool = {"type": "image_generation", field: value}
    r = httpx.post(f"{server}/v1/responses", json={"model": MODEL, "input": "Draw a kite.", "tools": [tool]}, timeout=120)
    assert (r.status_code, images.status_code) == (status, status), (r.text, images.text)
    got, expected = r.json()["error"], images.json()["error"]
    assert (got["param"], expected["param"]) == (f"tools[0].{field}", field)
    assert (got["code"], got["message"]) == (expected["code"], expected["message"].replace(f"'{field}'", f"'tools[0].{field}'"))


def test_the_image_tools_model_naming_the_answering_model_draws(client: openai.OpenAI) -> None:
    named = {"type": "image_generation", "model": MODEL, "size": "880x656"}
    drawn = client.responses.create(model=MODEL, input="Draw a kite.", tools=[named], tool_choice={"type": "image_generation"},
                                    reasoning=NO_REASONING)  # fmt: skip
    (call,) = [item for item in drawn.output if item.type == "image_generation_call"]
    assert _png(base64.b64decode(call.result)).size == (880, 656)
