"""The audio output on its own: the voice table (checkpoint names, OpenAI's names round robin,
the speaker info of the reference's dialect), an audio span's way to the vocoder in growing
chunks, a span cut short, the continuation that speaks an unspoken answer, and a spoken answer
kept in the store. The vocoder is a fake that records each chunk it is sent."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import orjson
import pytest

from omni.engines.audio_decoder import AudioDecoderEngine
from omni.engines.generation import Delta, Generation, OutputOptions
from omni.engines.pool import ModelPool
from omni.errors import APIError
from omni.modalities.outputs.audio import (
    AUDIO,
    OPENAI_VOICES,
    AudioPiece,
    AudioRoute,
    ModelAudio,
    speaker_info,
    speaker_voice,
    store_spoken,
)
from omni.shared.store.local import LocalStore
from omni.text.constrained.audio_span import AudioSpanFormat
from omni.text.tokenizer import TextTokenizer
from scheduler.request import SamplingParams
from tests.omni.fake_pool import FakePool
from tests.omni.modalities.outputs.fake_vocoder import VOICES, FakeDecoder

START, END, FIRST_UNIT = 2000, 2001, 3000
FORMAT = AudioSpanFormat(START, END, FIRST_UNIT, num_units=100)


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def model_audio(decoder: FakeDecoder, tmp_path: Path, **chunking: int) -> ModelAudio:
    store = LocalStore(tmp_path, "http://x/files", b"secret")
    return ModelAudio(cast(AudioDecoderEngine, decoder), FORMAT, store, **chunking)


def a_generation(tokenizer: TextTokenizer, output_token_ids: list[int] = ()) -> Generation:  # type: ignore[assignment]
    g = Generation(cast(ModelPool, FakePool([1])), tokenizer, [1, 2], SamplingParams(max_tokens=64), "req", output=OutputOptions())
    g.request.output_token_ids = list(output_token_ids)
    return g


def units(*values: int) -> list[int]:
    return [FIRST_UNIT + v for v in values]


def samples(piece: AudioPiece) -> list[float]:
    return np.frombuffer(piece.samples, dtype="<f4").tolist()


# ----------------------------------------------------------------------------- voices


def test_a_voice_is_the_checkpoints_name_or_openais_round_robin(tmp_path: Path) -> None:
    audio = model_audio(FakeDecoder(), tmp_path)
    assert audio.voices == tuple(VOICES) and audio.sample_rate == 16000
    assert audio.voice_index("nara", "audio.voice") == 2
    assert [audio.voice_index(name, "audio.voice") for name in OPENAI_VOICES[:6]] == [0, 1, 2, 3, 0, 1]
    with pytest.raises(APIError) as refused:
        audio.voice_index("bogus", "audio.voice")
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, "audio.voice", "invalid_value")
    assert "mhwj, fkms, nara, jinho" in str(refused.value)


def test_before_the_decoder_is_ready_there_are_no_voices_and_a_503(tmp_path: Path) -> None:
    audio = model_audio(FakeDecoder(info=None, ready=False), tmp_path)
    assert (audio.voices, audio.sample_rate, audio.ready) == ((), 24000, False)
    with pytest.raises(APIError) as refused:
        audio.check_ready()
    assert refused.value.status == 503
    with pytest.raises(APIError):  # no table to map OpenAI's names onto
        audio.voice_index("alloy", "voice")


def test_speaker_info_is_the_last_tag_or_the_older_json_at_the_end() -> None:
    tagged = 'Hi <speaker_info>{"gender": "m"}</speaker_info> and <speaker_info>{"speaker": "nara"}</speaker_info>'
    assert speaker_info(tagged) == {"speaker": "nara"}
    assert speaker_info('Hello.\n\n{"gender": "f", "age": "20s"}\n\n<discrete_audio>') == {"gender": "f", "age": "20s"}
    assert speaker_info('{"gender": "f"} and then text') is None  # the old form only at the end
    assert speaker_info("<speaker_info>{not json}</speaker_info>") is None
    assert speaker_info("no info") is None


def test_speaker_info_picks_a_voice_by_name_then_by_gender() -> None:
    assert speaker_voice({"speaker": "jinho", "gender": "f"}, VOICES) == 3
    assert speaker_voice({"id": "nara"}, VOICES) == 2
    assert speaker_voice({"speaker": "unknown", "gender": "Female"}, VOICES) == 1
    assert speaker_voice({"gender": "m"}, VOICES) == 0
    assert speaker_voice({"gender": "m"}, ["a", "b"]) is None  # no such voice in this checkpoint
    assert speaker_voice({"age": "30s", "is_ref_audio": True}, VOICES) is None


# ----------------------------------------------------------------------------- a span


async def test_a_spans_units_go_out_in_growing_chunks_and_the_rest_at_its_end(tmp_path: Path, tokenizer: TextTokenizer) -> None:
    decoder = FakeDecoder()
    route = model_audio(decoder, tmp_path).route(2)
    assert route.opens(START) and not route.opens(FIRST_UNIT)  # a unit opens a span only in the dialect
    route.open(a_generation(tokenizer))
    deltas = []
    for u in range(60):
        delta = Delta("", [FIRST_UNIT + u])
        assert not await route.feed(delta, FIRST_UNIT + u)
        deltas.append(delta)
    last = Delta("", [END])
    assert await route.feed(last, END)
    (sink,) = decoder.sinks
    assert decoder.opened == [(2, None)]
    assert [len(c) for c, _ in sink.chunks] == [4, 8, 16, 25, 7]
    assert [flag for _, flag in sink.chunks] == [False] * 4 + [True]
    # each chunk rides on the delta whose unit completed it
    carrying = [i for i, d in enumerate(deltas) if AUDIO.pieces(d)]
    assert carrying == [3, 11, 27, 52]
    assert samples(AUDIO.pieces(deltas[3])[0]) == [0.0, 1.0, 2.0, 3.0]
    (tail,) = AUDIO.pieces(last)
    assert (tail.span, tail.last, tail.sample_rate, samples(tail)) == (0, True, 16000, [float(u) for u in range(53, 60)])
    assert route.after(a_generation(tokenizer)) is None  # no speak_after: nothing to continue


async def test_a_bare_span_starts_at_a_unit_and_ends_at_the_first_other_token(tmp_path: Path, tokenizer: TextTokenizer) -> None:
    decoder = FakeDecoder()
    route = model_audio(decoder, tmp_path, first_chunk_units=2).route(0, dialect=True)
    assert route.opens(FIRST_UNIT + 7)
    route.open(a_generation(tokenizer))
    fed = [Delta("", [t]) for t in units(8, 9, 10)]
    assert [await route.feed(d, t) for d, t in zip(fed, units(8, 9, 10))] == [False, False, False]
    end = Delta(".", [13])
    assert await route.feed(end, 13)  # text: the bare span ends
    (sink,) = decoder.sinks
    # the first chunk waits for the span's least units (3), over first_chunk_units
    assert sink.chunks == [([7, 8, 9], False), ([10], True)]
    assert AUDIO.pieces(end)[0].last and AUDIO.pieces(end)[0].span == 0
    # a second span is the second span
    assert route.opens(START)
    route.open(a_generation(tokenizer))
    for t in units(1, 2, 3):
        await route.feed(Delta("", [t]), t)
    closing = Delta("", [END])
    await route.feed(closing, END)
    assert AUDIO.pieces(closing)[-1].span == 1


async def test_a_span_cut_short_gives_its_audio_only_with_its_least_units(tmp_path: Path, tokenizer: TextTokenizer) -> None:
    decoder = FakeDecoder()
    spoken: list[Generation] = []
    route = model_audio(decoder, tmp_path).route(1, dialect=True)
    route.speak_after = lambda g: spoken.append(g) or g
    route.opens(FIRST_UNIT)
    route.open(a_generation(tokenizer))
    assert await route.feed(Delta("", [5]), 5)  # one unit, then text: under the least 3
    assert decoder.sinks[0].chunks == [] and decoder.sinks[0].closed
    g = a_generation(tokenizer)
    assert route.after(g) is g and spoken == [g]  # no audio came: the text is spoken after
    # the request's end cutting a span with enough units still gives them
    route.opens(START)
    route.open(a_generation(tokenizer))
    for t in units(1, 2, 3):
        await route.feed(Delta("", [t]), t)
    end = Delta("", [])
    await route.end(end, cut=True)
    assert [samples(p) for p in AUDIO.pieces(end)] == [[1.0, 2.0, 3.0]]
    assert route.after(a_generation(tokenizer)) is None  # a span gave audio: nothing to add


async def test_closing_a_route_mid_span_frees_its_vocoder_stream(tmp_path: Path, tokenizer: TextTokenizer) -> None:
    decoder = FakeDecoder()
    route = model_audio(decoder, tmp_path).route(0)
    route.opens(START)
    route.open(a_generation(tokenizer))
    await route.feed(Delta("", []), FIRST_UNIT)
    route.close()
    assert decoder.sinks[0].closed
    route.close()  # twice is harmless


async def test_in_the_dialect_the_speaker_info_before_a_span_picks_its_voice(tmp_path: Path, tokenizer: TextTokenizer) -> None:
    decoder = FakeDecoder()
    audio = model_audio(decoder, tmp_path)
    text = tokenizer.encode('Hi.<speaker_info>{"gender": "f"}</speaker_info>', add_special_tokens=False)
    route = audio.route(3, dialect=True, voice_named=False)
    route.opens(START)
    route.open(a_generation(tokenizer, [*text, START]))
    assert decoder.opened == [(1, None)]  # fkms, the female voice
    # a second span with no info of its own after the first: the default voice
    more = tokenizer.encode(" Bye.", add_special_tokens=False)
    route.close()
    route.opens(START)
    route.open(a_generation(tokenizer, [*text, START, *units(1, 2, 3), END, *more, START]))
    assert decoder.opened[-1] == (3, None)
    # a voice the request named wins over the model's info
    named = audio.route(3, dialect=True, voice_named=True)
    named.opens(START)
    named.open(a_generation(tokenizer, [*text, START]))
    assert decoder.opened[-1] == (3, None)


async def test_a_spoken_answer_is_kept_with_its_transcript(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, "http://x/files", b"secret")
    data = await store_spoken(store, "audio_1", np.zeros(240, dtype=np.float32), "pcm", "hello")
    assert data == bytes(480)  # 240 samples of 16-bit silence
    assert await store.get("out/audio/audio_1.pcm") == data
    assert orjson.loads(await store.get("out/audio/audio_1.json")) == {"id": "audio_1", "format": "pcm", "transcript": "hello"}
    wav = await store_spoken(store, "audio_2", np.zeros(240, dtype=np.float32), "wav", "")
    assert wav[:4] == b"RIFF" and await store.get("out/audio/audio_2.wav") == wav


class NoAudioTokens:
    def token_to_id(self, token: str) -> int | None:
        return None


def test_the_span_format_is_the_vocabularys_or_the_model_cannot_speak(tokenizer: TextTokenizer, tmp_path: Path) -> None:
    store = LocalStore(tmp_path, "http://x/files", b"secret")
    audio = ModelAudio.for_model(cast(AudioDecoderEngine, FakeDecoder()), tokenizer, store)
    fmt = audio.format
    assert (fmt.start_token_id, fmt.end_token_id) == (
        tokenizer.token_to_id("<|discrete_audio_start|>"), tokenizer.token_to_id("<|discrete_audio_end|>"),
    )  # fmt: skip
    assert fmt.first_unit_id == tokenizer.token_to_id("<|audio0000|>")
    with pytest.raises(ValueError, match="lacks the audio span tokens"):
        ModelAudio.for_model(cast(AudioDecoderEngine, FakeDecoder()), cast(TextTokenizer, NoAudioTokens()), store)


def test_the_route_carries_the_models_chunking_and_voice(tmp_path: Path) -> None:
    decoder = FakeDecoder()
    route = model_audio(decoder, tmp_path, first_chunk_units=6, chunk_units=10).route(2, embedding=b"e", opened=True)
    assert isinstance(route, AudioRoute)
    assert (route.first_chunk_units, route.chunk_units, route.opened, route.bare_units) == (6, 10, True, False)
    route.open_stream()
    assert decoder.opened == [(2, b"e")]
    assert route.speaker_stream is None
