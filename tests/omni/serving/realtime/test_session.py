"""A realtime session's parts that need no model: a failed response answers with the one error
mapping (omni/serving/errors.py), as the HTTP API does (its `error` event, then response.done
failed with that type and code); session.update and response.create overlay the settings by one
rule. The whole session runs in tests/e2e/test_realtime.py."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import orjson
import pytest

from omni.engines.generation import Delta, Usage
from omni.serving import chat as serving_chat
from omni.serving.errors import api_error
from omni.serving.realtime import client_events as ev
from omni.serving.realtime.session import RealtimeSession, overlay
from omni.text.parsers.tool_calls import ToolFunction
from omni.text.reply_parser import OutputFormat
from tests.omni.serving.test_errors import CASES, IDS


def _session(events: list[dict[str, Any]]) -> RealtimeSession:
    model = SimpleNamespace(name="m", output=lambda kind: None, media=None)  # a text model: no output kind, no media
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


# ---------------------------------------------------------------- the conversation comes back


async def test_a_turn_whose_second_call_was_cut_is_answered_after_the_tools_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model calls twice and max_output_tokens cuts the second call: both stay in the
    conversation (incomplete, as written); after the first one's output, response.create answers,
    the cut call left out of the prompt (omni/serving/requests/chat.py _arguments)."""
    whole = '<tool_call>{"name": "weather", "arguments": {"city": "Seoul"}}</tool_call>'
    cut = '<tool_call>{"name": "weather", "arguments": {"city": "Par'
    replies = [[Delta(whole, [1]), Delta(cut, [2], finish_reason="length")], [Delta("Clear.", [3], finish_reason="stop")]]
    reqs: list[Any] = []

    async def chat(models: Any, req: Any, **kwargs: Any) -> Any:
        reqs.append(req)
        deltas = replies[len(reqs) - 1]

        async def stream() -> Any:
            for delta in deltas:
                yield delta

        output = SimpleNamespace(deltas=stream, usage=Usage(5, len(deltas), 0))
        fmt = OutputFormat(tool_parser="hermes", tools=(ToolFunction("weather"),))
        return SimpleNamespace(output_format=fmt, outputs=[output], admitted=contextlib.nullcontext)

    monkeypatch.setattr(serving_chat, "chat", chat)
    events: list[dict[str, Any]] = []
    session = _session(events)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}
    await session.handle(orjson.dumps({"type": "conversation.item.create", "item": item}))
    for _ in range(2):
        session.respond(ev.ResponseFields())
        assert session._response is not None
        await session._response[1]
        if len(reqs) == 1:
            first, second = [i for i in session.conversation.items if i["type"] == "function_call"]
            assert (first["status"], second["status"]) == ("completed", "incomplete")  # only the cut one
            assert second["arguments"] == '{"city": "Par'
            output = {"type": "function_call_output", "call_id": first["call_id"], "output": "3C"}
            await session.handle(orjson.dumps({"type": "conversation.item.create", "item": output}))
    assert not [e for e in events if e["type"] == "error"]
    (done,) = [e["response"] for e in events if e["type"] == "response.done"][1:]
    assert (done["status"], done["output"][0]["content"]) == ("completed", [{"type": "output_text", "text": "Clear."}])
    messages = reqs[1].template_messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == [first["call_id"]]
