"""A Realtime session's settings: their defaults, one overlay rule for session.update and
response.create, and the session object sent back."""

from __future__ import annotations

import msgspec

from omni.serving.realtime import client_events as ev
from omni.serving.realtime.settings import default_settings, overlay, session_object


def test_the_defaults_follow_what_the_model_and_server_can_do() -> None:
    spoken = default_settings(speaks=True, detects_voice=True)
    assert (spoken["output_modalities"], spoken["turn_detection"]) == (["audio"], ev.ServerVad())
    typed = default_settings(speaks=False, detects_voice=False)
    assert (typed["output_modalities"], typed["turn_detection"], typed["truncation"]) == (["text"], None, "auto")


def test_session_update_and_response_create_overlay_the_settings_they_name() -> None:
    """One rule for both events: a given field that is a setting of the same name replaces it."""
    settings = default_settings(speaks=False, detects_voice=False)
    taken = {"instructions", "output_modalities", "tools", "tool_choice", "temperature", "max_output_tokens",
             "parallel_tool_calls", "seed", "logit_bias"}  # fmt: skip
    assert {f.name for f in msgspec.structs.fields(ev.SessionFields)} & set(settings) == taken | {"truncation"}
    assert {f.name for f in msgspec.structs.fields(ev.ResponseFields)} & set(settings) == taken

    s = overlay(settings, ev.SessionFields(temperature=0.3, truncation="disabled", seed=5))
    assert (s["temperature"], s["truncation"], s["seed"], s["instructions"]) == (0.3, "disabled", 5, "")
    r = overlay(s, ev.ResponseFields(instructions="Be brief.", logit_bias={"5": 1.0}, metadata={"a": "b"}))
    assert (r["instructions"], r["logit_bias"], r["temperature"], "metadata" in r) == ("Be brief.", {"5": 1.0}, 0.3, False)
    assert settings["temperature"] is None  # the session's own settings are left as they were


def test_the_session_object_shows_the_settings_as_openai_names_them() -> None:
    s = default_settings(speaks=True, detects_voice=True)
    s["tools"] = [ev.FunctionTool(type="function", name="weather")]
    body = session_object("sess_1", "omni", s)
    assert (body["object"], body["id"], body["model"], body["truncation"]) == ("realtime.session", "sess_1", "omni", "auto")
    assert body["tools"] == [{"type": "function", "name": "weather"}]
    assert body["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert body["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy", "speed": 1.0}
