"""openai-agents' voice agent (the Agents SDK's RealtimeRunner) against GET /v1/realtime with
its default settings: all it is told is where the server is. Its session.update asks for the
model it defaults to (served here as an alias of the tiny omni checkpoint), voice "ash", pcm16
both ways, transcription by gpt-4o-mini-transcribe (the served model transcribes) and
turn_detection {"type": "semantic_vad", "interrupt_response": true}: every part is accepted, and
a spoken turn under it starts and stops. (How semantic_vad decides: the unit tests of
turn_detection.py and the session; how well: bench/semantic_vad.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.audio import spoken
from tests.e2e.server import running_server

pytest.importorskip("agents")
from agents.realtime import RealtimeAgent, RealtimeRunner  # noqa: E402
from agents.realtime.openai_realtime import DEFAULT_REALTIME_MODEL  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(omni_dir: Path) -> Iterator[str]:
    with running_server(
        str(omni_dir), "--served-model-name", "omni", DEFAULT_REALTIME_MODEL, "--max-model-len", "2048",
        "--no-image-output",
    ) as base:  # fmt: skip
        yield base


async def _events(session: Any, until: str, seen: list[dict[str, Any]], timeout: float = 120) -> dict[str, Any]:
    """The server's events (as the SDK passes them on, raw) into seen, up to the first of kind until."""

    async def read() -> dict[str, Any]:
        async for event in session:
            data = getattr(getattr(event, "data", None), "data", None)
            if event.type == "raw_model_event" and isinstance(data, dict):
                seen.append(data)
                if data.get("type") == until:
                    return data
        raise AssertionError(f"the session ended before {until}")

    return await asyncio.wait_for(read(), timeout)


async def test_the_agents_sdk_default_session_is_accepted_and_its_turn_ends(server: str) -> None:
    ws = server.replace("http://", "ws://")
    runner = RealtimeRunner(RealtimeAgent(name="Assistant", instructions="Answer briefly."))
    session = await runner.run(model_config={"url": f"{ws}/v1/realtime?model=omni", "api_key": "unused"})
    seen: list[dict[str, Any]] = []
    async with session:
        updated = await _events(session, "session.updated", seen)
        while not any(e["session"]["instructions"] == "Answer briefly." for e in seen if e["type"] == "session.updated"):
            updated = await _events(session, "session.updated", seen)  # the agent's instructions come in their own update
        audio_in = updated["session"]["audio"]["input"]
        assert audio_in["turn_detection"] == {
            "type": "semantic_vad", "eagerness": "auto", "create_response": True, "interrupt_response": True,
        }  # fmt: skip
        assert audio_in["transcription"]["model"] == "gpt-4o-mini-transcribe"
        assert audio_in["format"] == {"type": "audio/pcm", "rate": 24000}
        assert updated["session"]["audio"]["output"]["voice"] == "ash"
        assert updated["session"]["model"] == "omni"

        clip = spoken("What is the capital of France?", silence_s=5.0)  # more than medium's 4 s at most
        if clip is None:
            pytest.skip("espeak-ng is not installed")
        await session.send_audio((np.clip(clip, -1, 1) * 32767).astype("<i2").tobytes())
        stopped = await _events(session, "input_audio_buffer.speech_stopped", seen)
        committed = await _events(session, "input_audio_buffer.committed", seen)
    kinds = [e["type"] for e in seen]
    assert [e for e in seen if e["type"] == "error"] == []
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index("input_audio_buffer.speech_stopped")
    assert committed["item_id"] == stopped["item_id"]
