"""The speech API's lifecycle without HTTP: the speaking model is found, the input becomes a
user turn (the instructions a system turn) whose prompt opens the audio span, one choice is held
to the span grammar within the context left, in the voice asked for or a recording's; and
each way a request cannot be spoken is a 400 naming its field. A FakePool and a fake vocoder
stand for the workers."""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from omni.engines.audio_decoder import AudioDecoderEngine
from omni.engines.pool import ModelPool
from omni.errors import APIError
from omni.modalities.outputs.audio import ModelAudio
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.requests.speech import parse_speech_request
from omni.serving.speech import speech
from omni.shared import protocol
from omni.shared.media.audio_encoding import encode_audio
from omni.shared.store.local import LocalStore
from omni.text.constrained.constraint import allowed_tokens, fill_masks
from omni.text.tokenizer import TextTokenizer
from tests.omni.fake_pool import FakePool
from tests.omni.modalities.outputs.fake_vocoder import VOICES, FakeDecoder


@dataclass
class Vocoder(FakeDecoder):
    rooms_checked: int = 0
    embedded: list[tuple[int, int]] = field(default_factory=list)  # (samples, rate)

    def check_room(self) -> None:
        self.rooms_checked += 1

    async def embed_speaker(self, samples: bytes, sample_rate: int) -> bytes:
        self.embedded.append((len(samples) // 4, sample_rate))
        return b"voice"


@dataclass
class Setting:
    models: ModelRegistry
    model: ServedModel
    vocoder: Vocoder
    audio: ModelAudio


async def setting(tiny_tokenizer_dir: Path, tmp_path: Path, *, max_model_len: int = 256, encoder: bool = False) -> Setting:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    info = protocol.AudioDecoderReady(0, "cpu", 24000, 960, 64, list(VOICES), encoder)
    vocoder = Vocoder(info=info)
    audio = ModelAudio.for_model(cast(AudioDecoderEngine, vocoder), tokenizer, LocalStore(tmp_path, "", b"s"))
    model = ServedModel("talker", tokenizer, cast(ModelPool, FakePool([1], max_model_len=max_model_len)), created=0, outputs=(audio,))
    models = ModelRegistry()
    models.add(model)
    models.add(ServedModel("mute", tokenizer, cast(ModelPool, FakePool([1])), created=0))
    return Setting(models, model, vocoder, audio)


def body(**fields: Any) -> Any:
    return parse_speech_request({"input": "Hello there.", "voice": "nara", **fields})


async def test_the_input_becomes_a_prompt_that_opens_the_span(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    s = await setting(tiny_tokenizer_dir, tmp_path)
    prepared = await speech(s.models, body(instructions="Calmly.", max_units=100, seed=9), timeout=None)
    assert prepared.model is s.model and prepared.sample_rate == 24000
    request = prepared.output.generation.request
    ids = request.prompt_token_ids
    assert ids[-1] == s.audio.format.start_token_id
    text = s.model.tokenizer.decode(ids[:-1], skip_special_tokens=False)
    assert text.index("Calmly.") < text.index("Hello there.")  # the instructions as the system turn before it
    assert (request.sampling_params.max_tokens, request.sampling_params.seed) == (101, 9)  # the units, then the end
    constraint = prepared.output.generation.constraint
    assert constraint is not None
    (mask,) = fill_masks([constraint])
    first = s.audio.format.first_unit_id
    assert allowed_tokens(mask, constraint.vocab_size).tolist() == list(range(first, first + 64))
    assert s.vocoder.rooms_checked == 1


async def test_the_voice_is_the_named_one_or_a_recordings(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    s = await setting(tiny_tokenizer_dir, tmp_path, encoder=True)
    prepared = await speech(s.models, body(voice="echo"), timeout=None)  # OpenAI's fifth name: row 0 of four
    assert prepared.output.routes[0].opened  # the prompt opened the span: its stream is open already
    assert s.vocoder.opened == [(0, None)]
    wav = encode_audio(np.zeros(8000, dtype=np.float32), 16000, "wav")
    recorded = parse_speech_request({"input": "Hi.", "reference_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}})
    await speech(s.models, recorded, timeout=None)
    assert s.vocoder.opened[-1] == (0, b"voice") and s.vocoder.embedded == [(8000, 16000)]


@pytest.mark.parametrize(
    ("policy", "sent", "served"),
    [("priority", None, -1), ("priority", 3, 3), ("fcfs", None, 0), ("fcfs", 0, 0)],  # -1: --voice-priority's default
)
async def test_speech_is_served_at_its_priority_or_the_voice_default(
    tiny_tokenizer_dir: Path, tmp_path: Path, policy: str, sent: int | None, served: int
) -> None:
    s = await setting(tiny_tokenizer_dir, tmp_path)
    pool = cast(FakePool, s.model.pool)
    pool.config = dataclasses.replace(pool.config, llm=dataclasses.replace(pool.config.llm, scheduling_policy=policy))
    prepared = await speech(s.models, body(**({} if sent is None else {"priority": sent})), timeout=None)
    assert prepared.output.generation.request.sampling_params.priority == served
    assert s.vocoder.orders == [(served, False)]  # the vocoder's order too: speech is no live session


async def test_under_fcfs_a_speech_priority_is_refused(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    s = await setting(tiny_tokenizer_dir, tmp_path)
    with pytest.raises(APIError) as e:
        await speech(s.models, body(priority=-1), timeout=None)
    assert (e.value.status, e.value.param, e.value.code) == (400, "priority", "unsupported_parameter")


async def test_what_cannot_be_spoken_is_a_400_naming_its_field(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    s = await setting(tiny_tokenizer_dir, tmp_path)

    async def refused(req: Any, models: ModelRegistry = s.models) -> APIError:
        with pytest.raises(APIError) as e:
            await speech(models, req, timeout=None)
        return e.value

    assert (await refused(body(voice="nobody"))).param == "voice"
    assert (await refused(body(model="mute"))).param == "model"
    recorded = parse_speech_request({"input": "Hi.", "reference_audio": {"data": "UklGRg==", "format": "wav"}})
    assert (await refused(recorded)).param == "reference_audio"  # this vocoder has no speaker encoder
    short = await setting(tiny_tokenizer_dir, tmp_path, max_model_len=24)
    too_long = await refused(body(input="word " * 40), short.models)
    assert (too_long.param, too_long.code) == ("input", "context_length_exceeded")


async def test_speech_needs_a_model_that_speaks(models: ModelRegistry) -> None:
    with pytest.raises(APIError) as e:
        await speech(models, parse_speech_request({"model": "m", "input": "Hi", "voice": "alloy"}), timeout=None)
    assert (e.value.status, e.value.param) == (400, "model")
    assert e.value.message == "The model 'm' has no audio decoder: it cannot speak."
