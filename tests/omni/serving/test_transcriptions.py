"""The transcriptions lifecycle without workers: the instruction and the client's hints, and a
request the served models cannot hear is a 400 naming `model` before any audio is read. The
lifecycle over HTTP with a fake media pipeline (the prompt, the sampling, every response format)
is tests/omni/serving/requests/test_transcriptions.py's; on real workers, tests/e2e/test_transcriptions.py."""

from __future__ import annotations

import pytest

from omni.errors import APIError
from omni.serving import transcriptions as lifecycle
from omni.serving.model import ModelRegistry
from omni.serving.requests.transcriptions import TranscriptionRequest
from tests.omni.serving.text_model import AdmittingPool


def test_the_instruction_comes_first_then_the_hints() -> None:
    assert lifecycle.transcription_instruction(TranscriptionRequest(model=None, file=b"")) == "Transcribe the audio verbatim."
    req = TranscriptionRequest(model=None, file=b"", language="ko", prompt="Nara, Seoul")
    assert lifecycle.transcription_instruction(req) == (
        "Transcribe the audio verbatim. The speech is in the language with ISO-639-1 code 'ko'. "
        "Follow the style, spelling and words of this text, which may precede the audio: Nara, Seoul"
    )


async def test_a_model_that_cannot_hear_is_a_400_naming_model(models: ModelRegistry, pool: AdmittingPool) -> None:
    with pytest.raises(APIError) as e:
        await lifecycle.transcription(models, TranscriptionRequest(model="m", file=b"RIFF"), timeout=None)
    assert (e.value.status, e.value.param) == (400, "model")
    assert e.value.message == "The model 'm' has no audio encoder: it cannot transcribe."
    with pytest.raises(APIError) as e:
        await lifecycle.transcription(models, TranscriptionRequest(model=None, file=b"RIFF"), timeout=None)
    assert (e.value.status, e.value.param) == (400, "model")
    assert pool.submitted == []
