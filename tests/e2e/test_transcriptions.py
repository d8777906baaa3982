"""POST /v1/audio/transcriptions with the official openai client against the embedded omni
checkpoint (the shared speaking server): a one-second tone comes back as text in json, text
and verbose_json, streamed deltas join to the done event's text, and each bad upload is a 400
(or 413) naming its field. The model's weights are random: the text is asserted to be text,
not to say anything."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from openai.types.audio import (
    Transcription,
    TranscriptionTextDeltaEvent,
    TranscriptionTextDoneEvent,
    TranscriptionVerbose,
)

from tests.omni.shared.media.conftest import wav_bytes

MODEL = "omni"
TONE = wav_bytes(seconds=1.0)  # 44.1 kHz stereo: resampled and mixed down by the encoder worker
# One second of audio: 25 embedding rows for the encoder and 25 units for the audio tokenizer.
AUDIO_TOKENS = 50
MAX_MEDIA_BYTES = 20 * 1024 * 1024  # the server's default --max-media-bytes
SPECIAL = re.compile(r"<\|[^|]*\|>")


@pytest.fixture(scope="module")
def client(speaking_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{speaking_server}/v1", api_key="none", max_retries=0, timeout=120)


def _file() -> tuple[str, bytes, str]:
    return ("tone.wav", TONE, "audio/wav")


@pytest.fixture(scope="module")
def transcript(client: openai.OpenAI) -> Transcription:
    return client.audio.transcriptions.create(model=MODEL, file=_file(), language="en", prompt="A test tone.")


def test_json_is_the_transcript_and_its_token_usage(transcript: Transcription) -> None:
    assert isinstance(transcript.text, str) and transcript.text
    assert not SPECIAL.search(transcript.text)  # no special, unit or placeholder token
    usage = transcript.usage
    assert usage is not None and usage.type == "tokens"
    assert usage.input_token_details is not None and usage.input_token_details.audio_tokens == AUDIO_TOKENS
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens > AUDIO_TOKENS


def test_text_and_verbose_json_give_the_same_transcript(client: openai.OpenAI, transcript: Transcription) -> None:
    # the same prompt as the json one's: greedy decoding repeats its text
    text = client.audio.transcriptions.create(
        model=MODEL, file=_file(), language="en", prompt="A test tone.", response_format="text"
    )
    assert text == transcript.text
    verbose = client.audio.transcriptions.create(
        model=MODEL, file=_file(), language="en", prompt="A test tone.", response_format="verbose_json"
    )
    assert isinstance(verbose, TranscriptionVerbose)
    assert (verbose.text, verbose.language, verbose.duration) == (transcript.text, "en", 1.0)
    assert verbose.segments is not None and len(verbose.segments) == 1
    segment = verbose.segments[0]
    assert (segment.start, segment.end, segment.text) == (0.0, 1.0, transcript.text)
    assert segment.tokens and segment.avg_logprob <= 0.0


def test_stream_sends_deltas_then_the_done_text(client: openai.OpenAI, transcript: Transcription) -> None:
    events = list(
        client.audio.transcriptions.create(
            model=MODEL, file=_file(), language="en", prompt="A test tone.", stream=True
        )
    )
    *deltas, done = events
    assert deltas and all(isinstance(e, TranscriptionTextDeltaEvent) for e in deltas)
    assert isinstance(done, TranscriptionTextDoneEvent)
    text = "".join(e.delta for e in deltas if isinstance(e, TranscriptionTextDeltaEvent))
    assert done.text == text == transcript.text
    assert done.usage is not None and transcript.usage is not None
    assert done.usage.output_tokens == transcript.usage.output_tokens


BAD = {
    "no file": ({"model": (None, MODEL)}, 400, "file"),
    "not audio": ({"file": ("tone.wav", b"RIFF but no audio follows", "audio/wav")}, 400, "file"),
    "too large": ({"file": ("big.wav", b"\0" * (MAX_MEDIA_BYTES + 1), "audio/wav")}, 413, "file"),
    "srt": ({"file": _file(), "response_format": (None, "srt")}, 400, "response_format"),
    "timestamps": ({"file": _file(), "timestamp_granularities[]": (None, "word")}, 400, "timestamp_granularities"),
}


@pytest.mark.parametrize("files, status, param", BAD.values(), ids=BAD.keys())
def test_a_bad_upload_names_its_field(speaking_server: str, files: dict[str, object], status: int, param: str) -> None:
    r = httpx.post(f"{speaking_server}/v1/audio/transcriptions", files=files, timeout=120)  # type: ignore[arg-type]
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_a_json_body_is_a_400(speaking_server: str) -> None:
    r = httpx.post(f"{speaking_server}/v1/audio/transcriptions", json={"model": MODEL, "file": "tone.wav"}, timeout=120)
    assert r.status_code == 400
    assert "multipart/form-data" in r.json()["error"]["message"]
