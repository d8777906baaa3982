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



