"""A realtime session's parts that need no model: a failed response answers with the one error
mapping (omni/serving/errors.py), as the HTTP API does (its `error` event, then response.done
failed with that type and code); session.update and response.create overlay the settings by one
rule. The whole session runs in tests/e2e/test_realtime.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import msgspec
import orjson
import pytest

from omni.serving import chat as serving_chat
from omni.serving.errors import api_error
from omni.serving.realtime import client_events as ev
from omni.serving.realtime.session import RealtimeSession, overlay
from tests.omni.serving.test_errors import CASES, IDS


def _session(events: list[dict[str, Any]]) -> RealtimeSession:
    model = SimpleNamespace(name="m", output=lambda kind: None)  # a text model: it serves no output kind
    return RealtimeSession(cast(Any, None), cast(Any, model), events.append, vad_model=None, max_buffer_seconds=10.0)


@pytest.mark.parametrize("exc", [c[0] for c in CASES], ids=IDS)
async def test_a_failed_response_reports_the_one_mapping(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    async def chat(*args: Any, **kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr(serving_chat, "chat", chat)
    events: list[dict[str, Any]] = []
    session = _session(events)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    await session.handle(orjson.dumps({"type": "conversation.item.create", "item": item}))
    session.respond(ev.ResponseFields(), event_id="evt_1")
    assert session._response is not None
    await session._response[1]

    expected = api_error(exc)
    assert expected is not None
    (error,) = [e["error"] for e in events if e["type"] == "error"]
    assert error == {
        "type": expected.type, "code": expected.code, "message": f"response.create: {expected.message}",
        "param": expected.param, "event_id": "evt_1",
    }  # fmt: skip
    (done,) = [e["response"] for e in events if e["type"] == "response.done"]
    assert done["status"] == "failed"
    assert done["status_details"] == {"type": "failed", "error": {"type": expected.type, "code": expected.code}}


async def test_an_unexpected_failure_is_a_server_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async def chat(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(serving_chat, "chat", chat)
    events: list[dict[str, Any]] = []
    session = _session(events)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    await session.handle(orjson.dumps({"type": "conversation.item.create", "item": item}))
    session.respond(ev.ResponseFields())
    assert session._response is not None
    await session._response[1]
    (error,) = [e["error"] for e in events if e["type"] == "error"]
    assert (error["type"], error["code"]) == ("server_error", None)
    assert "secret" not in error["message"]


# ---------------------------------------------------------------- settings


def test_session_update_and_response_create_overlay_the_settings_they_name() -> None:
    """One rule for both events: a given field that is a setting of the same name replaces it."""
    events: list[dict[str, Any]] = []
    settings = _session(events).settings
    taken = {"instructions", "output_modalities", "tools", "tool_choice", "temperature", "max_output_tokens",
             "parallel_tool_calls", "seed", "logit_bias"}  # fmt: skip
    assert {f.name for f in msgspec.structs.fields(ev.SessionFields)} & set(settings) == taken | {"truncation"}
    assert {f.name for f in msgspec.structs.fields(ev.ResponseFields)} & set(settings) == taken

    s = overlay(settings, ev.SessionFields(temperature=0.3, truncation="disabled", seed=5))
    assert (s["temperature"], s["truncation"], s["seed"], s["instructions"]) == (0.3, "disabled", 5, "")
    r = overlay(s, ev.ResponseFields(instructions="Be brief.", logit_bias={"5": 1.0}, metadata={"a": "b"}))
    assert (r["instructions"], r["logit_bias"], r["temperature"], "metadata" in r) == ("Be brief.", {"5": 1.0}, 0.3, False)
    assert settings["temperature"] is None  # the session's own settings are left as they were


async def test_a_response_takes_its_overrides_and_the_session_keeps_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    bodies: list[Any] = []

    async def chat(models: Any, req: Any, **kwargs: Any) -> Any:
        bodies.append(req)
        raise RuntimeError("stop here")

    monkeypatch.setattr(serving_chat, "chat", chat)
    events: list[dict[str, Any]] = []
    session = _session(events)
    await session.handle(orjson.dumps({"type": "session.update", "session": {"type": "realtime", "temperature": 0.4, "seed": 3}}))
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    await session.handle(orjson.dumps({"type": "conversation.item.create", "item": item}))
    session.respond(ev.ResponseFields(temperature=1.5))
    assert session._response is not None
    await session._response[1]
    (req,) = bodies
    assert (req.temperature, req.seed) == (1.5, 3)
    assert session.settings["temperature"] == 0.4
