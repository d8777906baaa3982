"""The Responses body: what the official client sends converts, and each bad part is a 400
naming where it is, in the client's own terms."""

from __future__ import annotations

from typing import Any

import pytest

from omni.errors import APIError
from omni.serving.requests.image_edits import ImageEditForm, parse_image_edit_request
from omni.serving.requests.images import parse_image_generation_request
from omni.serving.requests.responses import (
    FunctionCallOutput,
    ImageGenerationChoice,
    ImageGenerationTool,
    InputFile,
    InputImage,
    Message,
    parse_response_request,
)


def test_a_string_input_and_typed_items() -> None:
    assert parse_response_request({"model": "m", "input": "hi"}).input == "hi"
    req = parse_response_request(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                             {"type": "input_image", "image_url": "data:image/png;base64,AA=="},
                                             {"type": "input_file", "file_data": "AA==", "filename": "x.png"}]},
                {"type": "function_call_output", "call_id": "c1", "output": "{}"},
            ],
            "tools": [{"type": "image_generation", "size": "768x768", "partial_images": 2}],
            "tool_choice": {"type": "image_generation"},
            "reasoning": {"effort": "none", "summary": "auto"},
        }
    )  # fmt: skip
    assert isinstance(req.input, list)
    message, output = req.input
    assert isinstance(message, Message) and isinstance(output, FunctionCallOutput)
    assert [type(p) for p in message.content] == [type(message.content[0]), InputImage, InputFile]
    assert isinstance(req.tool_choice, ImageGenerationChoice)
    assert isinstance(req.image_tool, ImageGenerationTool) and req.image_tool.parsed_size == (768, 768)
    assert req.reasoning is not None and req.reasoning.effort == "none"


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"input": [{"type": "computer_call"}]}, "input[0].type", "invalid_value"),
    ({"input": [{"role": "user", "content": [{"type": "input_video"}]}]}, "input[0].content[0].type", "invalid_value"),
    ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type", "invalid_value"),
    ({"tools": [{"type": "image_generation", "size": "1024x1024"}]}, "tools[0].size", "invalid_value"),
    ({"tools": [{"type": "image_generation", "background": "transparent"}]}, "tools[0].background", "unsupported_parameter"),
    ({"tools": [{"type": "image_generation", "output_format": "png", "output_compression": 50}]}, "tools[0].output_compression", "invalid_value"),
    ({"tools": [{"type": "image_generation", "input_fidelity": "medium"}]}, "tools[0].input_fidelity", "invalid_value"),
    ({"tools": [{"type": "image_generation", "partial_images": 4}]}, "tools[0].partial_images", None),
    ({"tools": [{"type": "image_generation", "step_cache_threshold": -1}]}, "tools[0].step_cache_threshold", None),
    ({"tools": [{"type": "image_generation", "step_cache_threshold": "x"}]}, "tools[0].step_cache_threshold", None),
    ({"tool_choice": {"type": "function", "name": "f"}}, "tool_choice.name", "invalid_value"),
    ({"tool_choice": {"type": "image_generation"}}, "tool_choice", "invalid_value"),
    ({"max_tool_calls": 3}, "max_tool_calls", "unsupported_parameter"),
    ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
    ({"frequency_penalty": 1}, "frequency_penalty", "unknown_parameter"),
    ({"background": True, "store": False}, "store", None),
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "invalid_value"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "invalid_value"),
    ({"text": {"format": {"type": "json_schema"}}}, "text.format.name", None),
]


@pytest.mark.parametrize("extra, param, code", BAD)
def test_a_bad_part_is_a_400_naming_it(extra: dict[str, Any], param: str, code: str | None) -> None:
    with pytest.raises(APIError) as caught:
        parse_response_request({"model": "m", "input": "hi", **extra})
    assert caught.value.status == 400
    assert caught.value.param == param, caught.value.message
    if code is not None:
        assert caught.value.code == code


def test_input_is_needed_unless_a_turn_continues() -> None:
    with pytest.raises(APIError) as caught:
        parse_response_request({"model": "m"})
    assert caught.value.param == "input"
    assert parse_response_request({"model": "m", "previous_response_id": "resp_1"}).input == ""


def _refusal(parse: Any, *args: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        parse(*args)
    return caught.value


@pytest.mark.parametrize(
    ("name", "value", "images_api"),
    [
        ("quality", "high", lambda v: parse_image_generation_request({"prompt": "a kite", "quality": v})),
        ("moderation", "low", lambda v: parse_image_generation_request({"prompt": "a kite", "moderation": v})),
        ("background", "transparent", lambda v: parse_image_generation_request({"prompt": "a kite", "background": v})),
        ("input_fidelity", "high", lambda v: parse_image_edit_request(ImageEditForm({"prompt": ["x"], "input_fidelity": [v]}, {"image": [b"png"]}))),
        ("output_compression", 50, lambda v: parse_image_generation_request({"prompt": "a kite", "output_compression": v})),
        ("size", "999x999", lambda v: parse_image_generation_request({"prompt": "a kite", "size": v})),
    ],
)
def test_the_image_tool_refuses_what_the_images_api_refuses_with_its_400(name: str, value: Any, images_api: Any) -> None:
    """The same status, code and message, named at the tool's field; the images API's default is
    taken by both."""
    tool = _refusal(parse_response_request, {"model": "m", "input": "hi", "tools": [{"type": "image_generation", name: value}]})
    images = _refusal(images_api, value)
    assert (tool.status, tool.code, tool.param) == (images.status, images.code, f"tools[0].{name}")
    assert tool.message == images.message.replace(f"'{name}'", f"'tools[0].{name}'")


def test_the_image_tool_takes_the_images_apis_defaults() -> None:
    tool = {"type": "image_generation", "quality": "auto", "moderation": "auto", "background": "opaque", "input_fidelity": "low"}
    req = parse_response_request({"model": "m", "input": "hi", "tools": [tool]})
    assert req.image_tool is not None and req.image_tool.input_fidelity == "low"
