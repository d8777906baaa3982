"""A Responses request as chat's turn: items become chat's messages, the tools and formats
chat's fields, and an error chat's parser raises names the Responses field."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from omni.errors import APIError
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.requests.responses import parse_response_request
from omni.serving.responses.turn import T2I_FUNCTION, ParamMap, check_image_tool_model, response_turn
from omni.shared.media.errors import MediaError
from omni.text.parsers.tool_grammar import T2I_TOOL

IMAGE = "data:image/png;base64,iVBORw0KGgo="


def _model(*, images: bool = False, tool_parser: str | None = None) -> ServedModel:
    fmt = SimpleNamespace(span_tokens=76, start_token_id=500)
    return cast(ServedModel, SimpleNamespace(
        name="m", output=lambda kind: SimpleNamespace(format=fmt) if images else None,
        chat_format=SimpleNamespace(tool_parser=tool_parser),
    ))  # fmt: skip


def _turn(body: dict[str, Any], history: list[dict[str, Any]] | None = None, **model: Any) -> Any:
    return response_turn(_model(**model), parse_response_request({"model": "m", **body}), history or [])


def test_items_become_chat_messages() -> None:
    history = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "answer"}]
    turn = _turn(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": IMAGE},
                                             {"type": "input_file", "file_data": "AAAA", "filename": "p.jpg"}]},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{\"a\": 1}"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {"type": "image_generation_call", "id": "ig_1", "result": "AAAA"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
            ],
        },
        history,
    )  # fmt: skip
    assert turn.messages[:2] == history  # instructions are not part of the conversation kept
    messages = [m.to_template_dict() for m in turn.chat.messages]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    user = messages[3]["content"]
    assert [p["type"] for p in user] == ["text", "image_url", "image_url"]
    assert user[2]["image_url"]["url"] == "data:image/jpeg;base64,AAAA"
    calls = messages[4]
    assert calls["role"] == "assistant" and calls["reasoning_content"] == "thinking"
    assert [c["id"] for c in calls["tool_calls"]] == ["c1", "c2"]
    assert messages[5] == {"role": "tool", "content": "one", "tool_call_id": "c1"}
    assert messages[6] == {"role": "assistant", "content": "done"}
    assert len(messages) == 7  # the image call is left out


def test_tools_choice_format_and_reasoning_are_chats() -> None:
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    turn = _turn({
        "input": "hi", "tools": [tool], "tool_choice": {"type": "function", "name": "f"},
        "parallel_tool_calls": False, "max_output_tokens": 9, "temperature": 0.5, "top_p": 0.5,
        "reasoning": {"effort": "minimal"},
    })  # fmt: skip
    chat = turn.chat
    assert [f.name for f in chat.tools.functions] == ["f"] and chat.tools.choice == "named"
    assert chat.tools.single_call and chat.max_tokens == 9 and (chat.temperature, chat.top_p) == (0.5, 0.5)
    assert chat.reasoning_effort == "minimal"  # chat's field, and so chat's rule
    assert chat.template.kwargs == {"reasoning_effort": "minimal", "skip_reasoning": True, "enable_thinking": False}
    assert chat.modalities == ("text",) and chat.priority == 0
    assert _turn({"input": "hi", "priority": -2}).chat.priority == -2  # chat's field, checked as chat's
    with pytest.raises(APIError) as caught:
        _turn({"input": "hi", "priority": 2**40})
    assert caught.value.param == "priority"
    schema = _turn({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}})
    grammar = schema.chat.grammar
    assert grammar is not None and schema.params.name(grammar.param) == "text.format.schema"


def test_image_generation_is_the_models_way_of_drawing() -> None:
    tool = {"type": "image_generation", "size": "768x768", "output_format": "webp", "step_cache_threshold": 0.1}
    forced = {"input": "draw", "tools": [tool], "tool_choice": {"type": "image_generation"}}
    dialect = _turn(forced, images=True, tool_parser="hyperclovax")
    assert dialect.t2i_call and dialect.chat.tools.named == T2I_TOOL
    assert dialect.chat.tools_sent[-1].function.name == T2I_FUNCTION["function"]["name"]  # type: ignore[index]
    assert dialect.chat.image is not None and dialect.chat.image.size == (768, 768)
    assert dialect.chat.image.response_format == "b64_json" and dialect.chat.image.output_format == "webp"
    assert dialect.chat.image.step_cache_threshold == 0.1
    spans = _turn(forced, images=True)
    assert not spans.t2i_call and spans.chat.logit_bias == ((500, 100.0),) and spans.chat.max_tokens == 77
    with pytest.raises(APIError) as caught:
        _turn(forced)
    assert caught.value.param == "tools[0]"


def test_chats_errors_name_the_responses_fields() -> None:
    params = ParamMap({"messages[2]": "input[1]", "messages[2].tool_calls[1]": "input[3]"})
    error = params.rename(MediaError("Invalid base64 data in messages[2].content[1].", param="messages[2].content[1]"))
    assert (error.param, error.message) == ("input[1].content[1]", "Invalid base64 data in input[1].content[1].")
    assert params.name("messages[2].tool_calls[1].function.arguments") == "input[3].function.arguments"
    assert params.name("messages[20]") == "messages[20]"
    # arguments that are no object are not refused (chat leaves such a call out of the prompt)
    bad = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}
    assert _turn({"input": [{"role": "user", "content": "hi"}, bad]}).chat.template_messages[1]["content"] == ""
    tool = {"type": "function", "name": "f"}
    turn = _turn({"input": "hi", "tools": [{"type": "image_generation"}, tool]}, images=True)
    assert turn.params.name("tools[0].function.parameters") == "tools[1].parameters"


def test_the_image_tools_model_names_the_answering_model_as_the_images_api_names_one() -> None:
    """It is honoured as the images API's `model`: a served model's name or alias, else the same
    404 (named at the tool's field); and since the answering model draws the turn's images, a
    name of another served model is a 400."""
    models = ModelRegistry()
    models.add(_model(images=True), aliases=("m-alias",))
    other = cast(ServedModel, SimpleNamespace(name="other", images=object()))
    models.add(other)

    def check(tool_model: str | None) -> None:
        check_image_tool_model(models, parse_response_request(
            {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}, {"type": "image_generation", "model": tool_model}]}
        ))  # fmt: skip

    for name in (None, "m", "m-alias"):
        check(name)
    with pytest.raises(APIError) as caught:
        check("gpt-image-1")
    with pytest.raises(APIError) as images_api:
        models.get("gpt-image-1")
    error, expected = caught.value, images_api.value
    assert (error.status, error.code, error.message) == (expected.status, expected.code, expected.message) == (
        404, "model_not_found", "The model `gpt-image-1` does not exist."
    )
    assert error.param == "tools[1].model"
    with pytest.raises(APIError) as caught:
        check("other")
    assert (caught.value.status, caught.value.param) == (400, "tools[1].model")
    assert "its own model draws its images" in caught.value.message
