"""A Realtime session's settings: a plain dict of OpenAI's field names (and ours: seed,
logit_bias, temperature), their defaults, the overlay a session.update or response.create
makes, and the session object the server sends back (session.created, session.updated)."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from omni.serving.realtime import client_events as ev


def default_settings(*, speaks: bool, detects_voice: bool) -> dict[str, Any]:
    """speaks: the model has an audio decoder; detects_voice: the server has a VAD model."""
    return {
        "instructions": "",
        "output_modalities": ["audio"] if speaks else ["text"],
        "input_format": ev.AudioFormat(),
        "output_format": ev.AudioFormat(),
        "voice": "alloy",
        "transcription": None,
        "turn_detection": ev.ServerVad() if detects_voice else None,
        "tools": [],
        "tool_choice": "auto",
        "temperature": None,
        "max_output_tokens": "inf",
        "parallel_tool_calls": True,
        "truncation": "auto",
        "seed": None,
        "logit_bias": None,
    }


def overlay(settings: dict[str, Any], fields: ev.SessionFields | ev.ResponseFields) -> dict[str, Any]:
    """The settings with each field the event gives that is a setting of the same name replacing
    it: session.update's for the session, response.create's for one response (a field added to
    the event and to the settings needs no line here). Fields of other names (audio's parts,
    model, conversation, input) are read apart."""
    s = dict(settings)
    for f in msgspec.structs.fields(fields):
        value = getattr(fields, f.name)
        if f.name in s and value is not UNSET:
            s[f.name] = value
    return s


def session_object(session_id: str, model_name: str, s: dict[str, Any]) -> dict[str, Any]:
    """The session as OpenAI's realtime.session object shows it."""
    vad = s["turn_detection"]
    tools = [msgspec.to_builtins(t) for t in s["tools"]]
    return {
        "type": "realtime", "object": "realtime.session", "id": session_id, "model": model_name,
        "output_modalities": s["output_modalities"], "instructions": s["instructions"], "tools": tools,
        "tool_choice": msgspec.to_builtins(s["tool_choice"]), "max_output_tokens": s["max_output_tokens"],
        "tracing": None, "truncation": s["truncation"], "prompt": None, "expires_at": 0, "include": None,
        "audio": {
            "input": {
                "format": s["input_format"].json(), "noise_reduction": None,
                "transcription": msgspec.to_builtins(s["transcription"]) if s["transcription"] else None,
                "turn_detection": msgspec.to_builtins(vad) if vad is not None else None,
            },
            "output": {"format": s["output_format"].json(), "voice": s["voice"], "speed": 1.0},
        },
    }  # fmt: skip
