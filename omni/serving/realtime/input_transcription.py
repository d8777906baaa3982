"""A user's speech in words, as POST /v1/audio/transcriptions writes it, at the voice priority
(--voice-priority under the priority policy): a spoken turn's transcript (session.py) and
semantic_vad's speech so far (end_of_turn.py)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing

from omni.engines.generation import Usage
from omni.serving import transcriptions
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.requests.transcriptions import TranscriptionRequest
from omni.serving.sampling import voice_priority


async def transcribe(
    models: ModelRegistry,
    model: ServedModel,
    wav: bytes,
    *,
    language: str | None = None,
    prompt: str | None = None,
    timeout: float | None,
    on_text: Callable[[str], None] | None = None,
) -> tuple[str, Usage]:
    """The transcript of wav by model, and its usage; on_text gets each piece as it comes."""
    priority = voice_priority(model.pool.config.llm)
    req = TranscriptionRequest(model=model.name, file=wav, language=language, prompt=prompt, priority=priority)
    run = await transcriptions.transcription(models, req, timeout=timeout)
    said: list[str] = []
    with run.admitted():
        async with aclosing(run.output.deltas()) as deltas:
            async for delta in deltas:
                if delta.text:
                    said.append(delta.text)
                    if on_text is not None:
                        on_text(delta.text)
    return "".join(said), run.output.usage
