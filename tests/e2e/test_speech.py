"""POST /v1/audio/speech with the official openai client against the embedded omni checkpoint:
every format decodes as 24 kHz mono, streamed bytes and SSE events give valid audio, the same
seed gives the same audio, speed stretches it, and bad input is a 400 naming the field."""

from __future__ import annotations

import base64
import io

import av
import httpx
import numpy as np
import openai
import pytest

from tests.e2e.audio import decoded

MODEL = "omni"
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")


@pytest.fixture(scope="module")
def client(speaking_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{speaking_server}/v1", api_key="none", max_retries=0)


def test_every_format_is_mono_24khz_audio_and_a_seed_repeats_it(client: openai.OpenAI) -> None:
    lengths = set()
    for fmt in FORMATS:
        response = client.audio.speech.create(
            model=MODEL, voice="alloy", input="Hello there.", response_format=fmt, extra_body={"seed": 3, "max_units": 40}
        )
        samples, rate = decoded(response.content, fmt)
        assert rate == (48000 if fmt == "opus" else 24000), fmt
        assert samples.size > 0.1 * rate and np.abs(samples).max() > 0.01, fmt  # at least 3 units of sound
        if fmt in ("wav", "flac", "pcm"):
            lengths.add(samples.size)
    assert len(lengths) == 1  # the same seed: the same units, the same length in every lossless format
    again = client.audio.speech.create(
        model=MODEL, voice="alloy", input="Hello there.", response_format="wav", extra_body={"seed": 3, "max_units": 40}
    )
    first = client.audio.speech.create(
        model=MODEL, voice="alloy", input="Hello there.", response_format="wav", extra_body={"seed": 3, "max_units": 40}
    )
    assert again.content == first.content


def test_streamed_bytes_and_events_are_valid_audio(client: openai.OpenAI, speaking_server: str) -> None:
    body = {"voice": "coral", "input": "One, two, three.", "extra_body": {"seed": 5, "max_units": 60}}
    whole = client.audio.speech.create(model=MODEL, response_format="pcm", **body).content  # type: ignore[arg-type]
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, response_format="pcm", stream_format="audio", **body  # type: ignore[arg-type]
    ) as response:
        chunks = list(response.iter_bytes())
    assert b"".join(chunks) == whole
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, response_format="mp3", stream_format="sse", **body  # type: ignore[arg-type]
    ) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    payloads = [httpx.Response(200, content=e[6:]).json() for e in events]
    assert [p["type"] for p in payloads][-1] == "speech.audio.done" and payloads[-1]["usage"]["output_tokens"] > 3
    mp3 = b"".join(base64.b64decode(p["audio"]) for p in payloads if p["type"] == "speech.audio.delta")
    samples, rate = decoded(mp3, "mp3")
    assert rate == 24000 and abs(samples.size - len(whole) // 2) < 3000  # mp3 adds its encoder delay


def test_speed_stretches_the_audio(client: openai.OpenAI) -> None:
    body = {"voice": "mhwj", "input": "Slowly now.", "response_format": "pcm", "extra_body": {"seed": 9, "max_units": 30}}
    normal = len(client.audio.speech.create(model=MODEL, **body).content)  # type: ignore[arg-type]
    fast = len(client.audio.speech.create(model=MODEL, speed=2.0, **body).content)  # type: ignore[arg-type]
    assert abs(fast / normal - 0.5) < 0.05


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"voice": "nobody", "input": "hi"}, "voice"),
        ({"voice": "alloy", "input": ""}, "input"),
        ({"voice": "alloy", "input": "x" * 4097}, "input"),
        ({"voice": "alloy", "input": "hi", "response_format": "ogg"}, "response_format"),
        ({"voice": "alloy", "input": "hi", "speed": 9}, "speed"),
        ({"voice": "alloy", "input": "hi", "stream_format": "chunks"}, "stream_format"),
        ({"input": "hi"}, "voice"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(speaking_server: str, body: dict[str, object], param: str) -> None:
    r = httpx.post(f"{speaking_server}/v1/audio/speech", json={"model": MODEL, **body}, timeout=120)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    if param == "voice" and "nobody" in str(body):
        assert "fkms" in r.json()["error"]["message"]  # the voices are listed


def _wav(freq: float) -> str:
    """A 1 s tone at 16 kHz as a base64 wav."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=16000, layout="mono")
        t = np.arange(16000) / 16000
        samples = (0.4 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2")[None, :]
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return base64.b64encode(buffer.getvalue()).decode()


def test_a_voice_taken_from_a_recording(speaking_server: str) -> None:
    def speak(reference: dict[str, str]) -> bytes:
        body = {"model": MODEL, "input": "Hello.", "response_format": "pcm", "seed": 2, "max_units": 12,
                "reference_audio": reference}  # fmt: skip
        r = httpx.post(f"{speaking_server}/v1/audio/speech", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.content

    low, high = speak({"data": _wav(150), "format": "wav"}), speak({"data": _wav(900), "format": "wav"})
    assert len(low) == len(high) > 0  # the same units (seeded), spoken in two voices
    assert low != high and low == speak({"data": _wav(150)})
    bad = httpx.post(f"{speaking_server}/v1/audio/speech", json={
        "model": MODEL, "input": "Hello.", "reference_audio": {"data": base64.b64encode(b"not audio").decode()},
    }, timeout=120)  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reference_audio"


def test_max_units_bounds_the_speech(speaking_server: str) -> None:
    for seed in range(4):
        body = {"model": MODEL, "voice": "alloy", "input": "Hello there.", "response_format": "pcm", "seed": seed, "max_units": 5}
        r = httpx.post(f"{speaking_server}/v1/audio/speech", json=body, timeout=120)
        assert r.status_code == 200, r.text
        units, rest = divmod(len(r.content), 960 * 2)  # 960 PCM16 samples a unit
        assert rest == 0 and 3 <= units <= 5, units
