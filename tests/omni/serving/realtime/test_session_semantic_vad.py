"""A session under semantic_vad, without a model: a scripted voice activity model (loud samples
are speech) on G.711 input (8 kHz, so one 256-sample window is 32 ms and no resampling blurs
it), and the transcription and end-of-turn scorer stubbed. The turn ends at the pause when what
was said scores as finished, and waits out the eagerness's max silence when it does not; with
no transcription, a fixed silence per eagerness ends it. (The session config over a socket and
through openai-agents: tests/e2e/test_realtime.py; the scorer on a real model: bench/semantic_vad.py.)"""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import orjson
import pytest

from omni.config import LLMConfig
from omni.serving.realtime import end_of_turn
from omni.serving.realtime.session import RealtimeSession

WINDOW = 256
LOUD, QUIET = 0x80, 0xFF  # G.711 mu-law: full scale, and zero


class ScriptedStream:
    def __init__(self) -> None:
        self._pending = np.zeros(0, np.float32)

    def push(self, x: np.ndarray) -> list[float]:
        x = np.concatenate([self._pending, x])
        whole = len(x) // WINDOW * WINDOW
        self._pending = x[whole:]
        return [0.9 if np.abs(x[i : i + WINDOW]).mean() > 0.1 else 0.05 for i in range(0, whole, WINDOW)]


async def _start(events: list[dict[str, Any]], turn_detection: dict[str, Any], transcribe: bool) -> RealtimeSession:
    pool = SimpleNamespace(config=SimpleNamespace(llm=LLMConfig()))
    model = SimpleNamespace(name="m", output=lambda kind: None, pool=pool)
    vad_model = SimpleNamespace(stream=ScriptedStream)
    s = RealtimeSession(cast(Any, None), cast(Any, model), events.append, vad_model=cast(Any, vad_model),
                        max_buffer_seconds=30.0)  # fmt: skip
    audio_input: dict[str, Any] = {"format": {"type": "audio/pcmu"}, "turn_detection": turn_detection}
    if transcribe:
        audio_input["transcription"] = {"model": "m"}
    await s.handle(orjson.dumps({"type": "session.update", "session": {"audio": {"input": audio_input}}}))
    assert [e["type"] for e in events] == ["session.updated"], events
    return s


async def _append(s: RealtimeSession, *runs: tuple[int, int]) -> None:
    """runs: (byte, windows) pieces of audio, sent as one append."""
    audio = b"".join(bytes([byte]) * (windows * WINDOW) for byte, windows in runs)
    await s.handle(orjson.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()}))
    await asyncio.gather(*s._tasks)  # the pause's scoring


def _turns(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
    out = []
    for e in events:
        if e["type"] == "input_audio_buffer.speech_started":
            out.append(("started", e["audio_start_ms"]))
        elif e["type"] == "input_audio_buffer.speech_stopped":
            out.append(("stopped", e["audio_end_ms"]))
    return out


@pytest.fixture
def scored(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """What each pause scored: the clip's samples and what it "said"; P(end) is 0.9 for a
    finished sentence and 0 otherwise."""
    asked: list[tuple[int, str]] = []
    said = iter(["what is the capital of", "what is the capital of france"])

    async def pause_score(models: Any, name: str, wav: bytes, language: str | None, *, timeout: float | None) -> float:
        assert name == "m"
        text = next(said)
        asked.append(((len(wav) - 44) // 2, text))
        return 0.9 if text.endswith("france") else 0.0

    monkeypatch.setattr(end_of_turn, "pause_score", pause_score)
    return asked


async def test_an_unfinished_sentence_waits_through_its_pause_and_a_finished_one_ends_at_once(scored: list[tuple[int, str]]) -> None:
    events: list[dict[str, Any]] = []
    s = await _start(events, {"type": "semantic_vad", "eagerness": "medium", "create_response": False}, True)
    # 1024 ms of speech, then a 512 ms pause: scored at 300 ms of it (its 10th window, 1344 ms)
    await _append(s, (LOUD, 32), (QUIET, 16))
    assert _turns(events) == [("started", 0)]  # "what is the capital of": not done
    # the speech goes on at 1536 ms for 512 ms, then pauses again
    await _append(s, (LOUD, 16), (QUIET, 16))
    assert _turns(events) == [("started", 0), ("stopped", 2560)]  # scored at 2368, stopped where the audio stood
    # each clip scored: what the buffer holds, from the speech's start (no padding before 0) to the
    # end of the append that brought the pause
    assert scored == [(1536 * 8, "what is the capital of"), (2560 * 8, "what is the capital of france")]
    kinds = [e["type"] for e in events]
    assert kinds.index("input_audio_buffer.committed") == kinds.index("input_audio_buffer.speech_stopped") + 1
    (committed,) = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    assert s.conversation.get(committed["item_id"])["content"][0]["type"] == "input_audio"


async def test_an_unlikely_end_is_ended_by_the_eagerness_max_silence(scored: list[tuple[int, str]]) -> None:
    events: list[dict[str, Any]] = []
    s = await _start(events, {"type": "semantic_vad", "eagerness": "high", "create_response": False}, True)
    await _append(s, (LOUD, 32), (QUIET, 16))
    assert _turns(events) == [("started", 0)]
    # high: 2000 ms of silence from 1024 ends it at the end of the window that reaches 3024 (3040)
    await _append(s, (QUIET, 48))
    assert _turns(events) == [("started", 0), ("stopped", 3040)]
    assert len(scored) == 1


async def test_without_transcription_silence_alone_ends_the_turn(scored: list[tuple[int, str]]) -> None:
    events: list[dict[str, Any]] = []
    s = await _start(events, {"type": "semantic_vad", "create_response": False}, False)
    # auto is medium: a 512 ms pause goes on; 1000 ms of silence (from 2048) ends the turn at 3072
    await _append(s, (LOUD, 32), (QUIET, 16), (LOUD, 16), (QUIET, 40))
    assert _turns(events) == [("started", 0), ("stopped", 3072)]
    assert scored == []  # nothing was transcribed or scored


async def test_the_session_shows_semantic_vad_as_given() -> None:
    events: list[dict[str, Any]] = []
    await _start(events, {"type": "semantic_vad", "eagerness": "low", "interrupt_response": False}, False)
    (updated,) = events
    assert updated["session"]["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad", "eagerness": "low", "create_response": True, "interrupt_response": False,
    }  # fmt: skip


async def test_a_turn_the_client_committed_while_its_pause_was_scored_gets_an_error_and_the_session_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = asyncio.Event()

    async def pause_score(models: Any, name: str, wav: bytes, language: str | None, *, timeout: float | None) -> float:
        await gate.wait()
        return 0.9

    monkeypatch.setattr(end_of_turn, "pause_score", pause_score)
    events: list[dict[str, Any]] = []
    s = await _start(events, {"type": "semantic_vad", "create_response": False}, True)
    audio = bytes([LOUD]) * (32 * WINDOW) + bytes([QUIET]) * (16 * WINDOW)
    await s.handle(orjson.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()}))
    await s.handle(orjson.dumps({"type": "input_audio_buffer.commit"}))  # all of it, while the pause is scored
    gate.set()
    await asyncio.gather(*s._tasks)
    assert _turns(events) == [("started", 0), ("stopped", 1536)]
    (error,) = [e["error"] for e in events if e["type"] == "error"]
    assert error["code"] == "input_audio_buffer_commit_empty"
    assert len([e for e in events if e["type"] == "input_audio_buffer.committed"]) == 1  # the client's
    await _append(s, (LOUD, 16), (QUIET, 16))  # the next turn is heard
    assert _turns(events)[2:] == [("started", 1536), ("stopped", 2560)]
