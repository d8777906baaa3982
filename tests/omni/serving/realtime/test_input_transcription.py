"""A user's speech in words: the transcription lifecycle's text pieces, joined and passed on as
they come, at the voice priority under the priority policy (0 under fcfs)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from omni.config import LLMConfig
from omni.engines.generation import Usage
from omni.serving import transcriptions
from omni.serving.realtime.input_transcription import transcribe


@pytest.mark.parametrize(("llm", "priority"), [(LLMConfig(), 0), (LLMConfig(scheduling_policy="priority"), -1)])
async def test_the_pieces_come_as_they_are_made_and_join_into_the_transcript(
    monkeypatch: pytest.MonkeyPatch, llm: LLMConfig, priority: int
) -> None:
    asked: list[Any] = []

    async def transcription(models: Any, req: Any, *, timeout: float | None) -> Any:
        asked.append(req)

        async def deltas() -> AsyncIterator[Any]:
            for text in ("What is ", "", "the time?"):
                yield SimpleNamespace(text=text)

        output = SimpleNamespace(deltas=deltas, usage=Usage(12, 3, 0))
        return SimpleNamespace(output=output, admitted=contextlib.nullcontext)

    monkeypatch.setattr(transcriptions, "transcription", transcription)
    model = SimpleNamespace(name="m", pool=SimpleNamespace(config=SimpleNamespace(llm=llm)))
    pieces: list[str] = []
    said, usage = await transcribe(cast(Any, None), cast(Any, model), b"wav", language="en", timeout=None, on_text=pieces.append)
    assert (said, pieces, usage.prompt_tokens) == ("What is the time?", ["What is ", "the time?"], 12)
    (req,) = asked
    assert (req.model, req.file, req.language, req.priority) == ("m", b"wav", "en", priority)
