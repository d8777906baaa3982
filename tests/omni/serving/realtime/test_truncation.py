"""truncation "auto" keeps the most recent messages that fit the context, counting what chat's
turn counts (an image as the tokens it expands to), and few enough media items; "disabled"
answers chat's error. chat here is a fake that counts a prompt and refuses one over its limit."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from omni.errors import APIError, bad_request
from omni.serving import chat as serving_chat
from omni.serving.realtime.truncation import Truncation, num_media, without_oldest

IMAGE_TOKENS, TEXT_TOKENS, CONTEXT = 100, 10, 250


def _user(*kinds: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": k} for k in kinds]}


def _tokens(messages: list[dict[str, Any]]) -> int:
    return sum(IMAGE_TOKENS * num_media([m]) + TEXT_TOKENS for m in messages)


@pytest.fixture
def tried(monkeypatch: pytest.MonkeyPatch) -> list[list[dict[str, Any]]]:
    """The messages of each turn chat was asked to prepare."""
    turns: list[list[dict[str, Any]]] = []

    async def chat(models: Any, req: Any, **kwargs: Any) -> Any:
        turns.append(req)
        if _tokens(req) >= CONTEXT:
            raise bad_request(f"{_tokens(req)} tokens", param="messages", code="context_length_exceeded")
        return SimpleNamespace(messages=req)

    monkeypatch.setattr(serving_chat, "chat", chat)
    return turns


def _request(messages: list[dict[str, Any]]) -> Any:
    return messages  # the fake chat reads the messages themselves


async def test_auto_leaves_out_the_fewest_oldest_messages_counting_images(tried: list[Any]) -> None:
    # 4 images of 100 tokens and 6 texts: 460 tokens; the last image and the texts after it fit
    messages = [_user("image_url"), _user("text"), _user("image_url"), _user("text"), _user("image_url"),
                _user("text"), _user("image_url", "text"), _user("text"), _user("text")]  # fmt: skip
    fitted = await Truncation(True).chat(cast(Any, None), messages, _request, timeout=None)
    assert fitted.messages == messages[5:] and _tokens(messages[4:]) >= CONTEXT  # one more would not fit
    assert len(tried) <= 1 + 4  # the whole, then halving over the 8 that may go


async def test_disabled_answers_the_context_error_and_auto_does_when_the_last_message_is_too_long(tried: list[Any]) -> None:
    messages = [_user("text"), _user("image_url", "image_url", "image_url")]
    for truncation in (Truncation(False), Truncation(True)):
        with pytest.raises(APIError) as e:
            await truncation.chat(cast(Any, None), messages, _request, timeout=None)
        assert e.value.code == "context_length_exceeded"
    # disabled tried the whole once; auto the whole, then the last message alone, and no less
    assert tried == [messages, messages, messages[1:]]


async def test_auto_keeps_the_media_items_within_the_models_cap(tried: list[Any]) -> None:
    messages = [_user("input_audio"), _user("input_audio"), _user("text"), _user("image_url")]
    fitted = await Truncation(True, max_media_items=1).chat(cast(Any, None), messages, _request, timeout=None)
    assert fitted.messages == messages[2:] and tried == [messages[2:]]
    with pytest.raises(APIError):  # disabled: chat answers for the whole (here, its context)
        await Truncation(False, max_media_items=1).chat(cast(Any, None), messages, _request, timeout=None)
    assert tried[-1] == messages


def test_a_tool_output_goes_with_its_call() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
    output = {"role": "tool", "tool_call_id": "c1", "content": "3C"}
    messages = [_user("text"), call, output, _user("text")]
    assert without_oldest(messages, 2) == [messages[3]]
    assert without_oldest(messages, 1) == messages[1:]


def test_truncation_of_the_sessions_setting() -> None:
    with_media = SimpleNamespace(media=SimpleNamespace(limits=SimpleNamespace(max_items_per_request=16)))
    assert Truncation.of("auto", cast(Any, with_media)) == Truncation(True, 16)
    assert Truncation.of("disabled", cast(Any, SimpleNamespace(media=None))) == Truncation(False, None)
