"""Reasoning effort, one rule for chat's reasoning_effort and the Responses API's
reasoning.effort: a template variable, and none or minimal skip the reasoning block."""

from __future__ import annotations

from typing import Any

import pytest

from omni.errors import APIError
from omni.serving.requests import parse_chat_completion_request
from omni.serving.requests.reasoning import effort_template_kwargs, skips_reasoning


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def error(body: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as e:
        parse_chat_completion_request(body)
    assert e.value.status == 400
    return e.value


def test_none_and_minimal_alone_skip_reasoning() -> None:
    efforts = ["none", "minimal", "low", "medium", "high", "xhigh", "max"]
    assert [skips_reasoning(e) for e in efforts] == [True, True, False, False, False, False, False]  # type: ignore[arg-type]
    assert not skips_reasoning(None) and effort_template_kwargs(None) == {}


SKIP = {"skip_reasoning": True, "enable_thinking": False}
KEEP = {"skip_reasoning": False, "enable_thinking": True}  # over a checkpoint's default that skips


@pytest.mark.parametrize(
    ("effort", "kwargs"),
    [
        (None, {}),
        ("none", {"reasoning_effort": "none", **SKIP}),
        ("minimal", {"reasoning_effort": "minimal", **SKIP}),
        ("low", {"reasoning_effort": "low", **KEEP}),
        ("medium", {"reasoning_effort": "medium", **KEEP}),
        ("high", {"reasoning_effort": "high", **KEEP}),
    ],
)
def test_reasoning_effort_is_a_template_variable_and_none_or_minimal_skip_reasoning(
    effort: str | None, kwargs: dict[str, Any]
) -> None:
    req = parse_chat_completion_request(chat(reasoning_effort=effort))
    assert req.reasoning_effort == effort and req.template.kwargs == kwargs


def test_the_clients_template_kwargs_win_over_its_reasoning_effort() -> None:
    req = parse_chat_completion_request(chat(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True}))
    assert req.template.kwargs == {"reasoning_effort": "none", "skip_reasoning": True, "enable_thinking": True}


@pytest.mark.parametrize("effort", ["extreme", "", 1, "None"])
def test_a_bad_reasoning_effort_is_a_400_naming_it(effort: Any) -> None:
    e = error(chat(reasoning_effort=effort))
    assert (e.param, e.code) == ("reasoning_effort", "invalid_value" if isinstance(effort, str) else "invalid_type")
    if isinstance(effort, str):
        assert e.message == (
            "Invalid value for 'reasoning_effort': expected one of "
            f"'high', 'low', 'max', 'medium', 'minimal', 'none', 'xhigh', got '{effort}'."
        )
