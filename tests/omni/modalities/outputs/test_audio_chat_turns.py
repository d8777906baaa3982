"""Spoken answers: the continuation that speaks a finished text (its prompt, its room, the
sampling it keeps), the room a spoken turn's text leaves for it, an earlier answer recalled by
its audio id as its transcript, and the spoken answer in the body (message.audio, delta.audio).
(Whether a request speaks at all is tests/e2e/test_chat_audio.py's.)"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
import pytest
from msgspec import UNSET

from omni.engines.audio_decoder import AudioDecoderEngine
from omni.engines.generation import Delta, Generation, OutputOptions
from omni.engines.pool import ModelPool
from omni.errors import APIError
from omni.modalities.outputs.audio import AUDIO, AudioPiece, ModelAudio, store_spoken
from omni.modalities.outputs.audio_chat import AudioDelta, ChatAudio, MessageAudio, chat_audio, speak_text, speech_room
from omni.serving.model import ServedModel
from omni.serving.prompt import recall_spoken
from omni.serving.requests import parse_chat_completion_request
from omni.shared.media.audio_encoding import float_to_pcm16
from omni.shared.store.local import LocalStore
from omni.text.chat_format import ChatFormat
from omni.text.constrained.audio_span import MAX_UNITS
from omni.text.constrained.constraint import allowed_tokens, fill_masks
from omni.text.tokenizer import TextTokenizer
from scheduler.request import SamplingParams
from tests.omni.fake_pool import FakePool
from tests.omni.modalities.outputs.fake_vocoder import FakeDecoder

EOS = 1282


@pytest.fixture
async def setting(tiny_tokenizer_dir: Path, tmp_path: Path) -> tuple[ServedModel, ModelAudio, LocalStore]:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    model = ServedModel("m", tokenizer, cast(ModelPool, FakePool([1], max_model_len=40)), created=0)
    store = LocalStore(tmp_path, "http://x/files", b"secret")
    audio = ModelAudio.for_model(cast(AudioDecoderEngine, FakeDecoder()), tokenizer, store)
    await audio.prepare(model.grammars)
    return model, audio, store


def finished(model: ServedModel, output: list[int], **params: Any) -> Generation:
    g = Generation(
        model.pool, model.tokenizer, [1, 2, 3], SamplingParams(**{"max_tokens": 20, **params}), "chat-1",
        output=OutputOptions(skip_special_tokens=False), cache_salt="s",
    )  # fmt: skip
    g.request.output_token_ids = list(output)
    return g


async def test_the_continuation_speaks_the_text_without_its_end(setting: tuple[ServedModel, ModelAudio, LocalStore]) -> None:
    model, audio, _ = setting
    text = finished(model, [10, 11, EOS], temperature=0.7, seed=5, top_k=40)
    speech = speak_text(model, audio, text)
    assert speech is not None
    start = audio.format.start_token_id
    assert speech.request.prompt_token_ids == [1, 2, 3, 10, 11, start]  # the EOS that ended it left out
    assert str(speech.request.request_id) == "chat-1-speech"
    params = speech.request.sampling_params
    assert (params.temperature, params.seed, params.top_k) == (0.7, 5, 40)
    assert params.max_tokens == 17  # what max_tokens left: 20 - 3
    assert speech.request.cache_salt == "s" and not speech.output.skip_special_tokens
    assert speech.constraint is not None and speech.constraint.active  # the span grammar from the first token


async def test_the_room_is_the_smaller_of_the_budget_and_the_context(setting: tuple[ServedModel, ModelAudio, LocalStore]) -> None:
    model, audio, _ = setting
    long = finished(model, list(range(10, 40)), max_tokens=100)  # 3 + 30 + 1 of a 40-token context
    speech = speak_text(model, audio, long)
    assert speech is not None and speech.request.sampling_params.max_tokens == 6
    # the least units (3) and the span's end need 4 tokens
    assert speak_text(model, audio, finished(model, list(range(10, 42)), max_tokens=100)) is not None  # 4 left
    assert speak_text(model, audio, finished(model, list(range(10, 43)), max_tokens=100)) is None  # 3 of the context
    assert speak_text(model, audio, finished(model, [10] * 16, max_tokens=20)) is not None
    assert speak_text(model, audio, finished(model, [10] * 17, max_tokens=20)) is None  # 3 of max_tokens


def test_a_spoken_turns_text_leaves_room_for_its_speech() -> None:
    """The text gets a ninth of max_tokens (a second of speech, 25 units, says about three of
    its tokens), the speech the rest up to a span's most units; no room under the least span."""
    assert speech_room(150) == 150 - 150 // 9  # 16 for the text, 134 for its speech
    assert speech_room(5) == 4  # one token of text, then the least span: 3 units and its end
    assert speech_room(4) == 0  # no span fits beside a token of text: the text has it all
    assert speech_room(20_000) == MAX_UNITS + 1
    assert speech_room(150, min_tokens=147) == 0 and speech_room(150, min_tokens=100) == 50


async def test_a_text_cut_at_its_share_is_spoken_in_the_room_kept_for_it(setting: tuple[ServedModel, ModelAudio, LocalStore]) -> None:
    model, audio, _ = setting
    cut = finished(model, [10] * 4, max_tokens=4)  # ran to its share: no end token to leave out
    assert speak_text(model, audio, cut) is None  # no room kept
    speech = speak_text(model, audio, cut, speech_tokens=12)
    assert speech is not None and speech.request.sampling_params.max_tokens == 12
    assert speech.request.prompt_token_ids == [1, 2, 3, 10, 10, 10, 10, audio.format.start_token_id]


async def test_a_text_cut_inside_its_reasoning_closes_it_before_the_speech(tiny_tokenizer_dir: Path, setting: tuple[ServedModel, ModelAudio, LocalStore]) -> None:
    _, audio, _ = setting
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    model = ServedModel("m", tokenizer, cast(ModelPool, FakePool([1], max_model_len=64)), created=0, chat_format=ChatFormat(reasoning_parser="think"))
    think, end = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
    start = audio.format.start_token_id
    inside = finished(model, [think, 10, 11], max_tokens=3)
    speech = speak_text(model, audio, inside, speech_tokens=8)
    assert speech is not None and speech.request.prompt_token_ids == [1, 2, 3, think, 10, 11, end, start]
    closed = finished(model, [think, 10, end, 11], max_tokens=4)
    speech = speak_text(model, audio, closed, speech_tokens=8)
    assert speech is not None and speech.request.prompt_token_ids == [1, 2, 3, think, 10, end, 11, start]
    plain = finished(model, [10, 11], max_tokens=2)  # no reasoning opened
    speech = speak_text(model, audio, plain, speech_tokens=8)
    assert speech is not None and speech.request.prompt_token_ids == [1, 2, 3, 10, 11, start]


async def test_the_reference_dialect_speaks_after_its_call_tag_in_bare_units(setting: tuple[ServedModel, ModelAudio, LocalStore]) -> None:
    """Its spoken answer is the text, its transcript closed, <audio_decoder_call>, bare units that
    the end of the turn ends (docs/REFERENCE_DIALECT.md), not our <|discrete_audio_start|> span."""
    model, audio, _ = setting
    tok = model.tokenizer
    call, at, end_at = (tok.token_to_id(t) for t in ("<audio_decoder_call>", "<assistant_transcript>", "</assistant_transcript>"))
    assert call is not None and at is not None and end_at is not None
    speech = speak_text(model, audio, finished(model, [10, 11, EOS], logit_bias=((EOS, 8.0), (10, 1.0))), dialect=True)
    assert speech is not None and speech.request.prompt_token_ids == [1, 2, 3, 10, 11, call]
    # the turn's end ends these units as the span's own end marker ends ours: the text's bias on it stays the text's
    assert speech.request.sampling_params.logit_bias == ((10, 1.0),)
    assert speech.constraint is not None and speech.constraint.active
    first = set(allowed_tokens(fill_masks([speech.constraint])[0], tok.vocab_size).tolist())
    assert first == set(range(audio.format.first_unit_id, audio.format.first_unit_id + audio.format.num_units))
    opened = speak_text(model, audio, finished(model, [at, 10, EOS]), dialect=True)
    assert opened is not None and opened.request.prompt_token_ids == [1, 2, 3, at, 10, end_at, call]
    closed = speak_text(model, audio, finished(model, [at, 10, end_at, 11, EOS]), dialect=True)
    assert closed is not None and closed.request.prompt_token_ids == [1, 2, 3, at, 10, end_at, 11, call]


@pytest.mark.parametrize("dialect", [False, True])
async def test_a_budget_that_cannot_hold_speech_is_a_400_not_a_silent_answer(
    setting: tuple[ServedModel, ModelAudio, LocalStore], dialect: bool
) -> None:
    _, audio, _ = setting
    spoken = ChatAudio(audio, 0, "wav", dialect)
    with pytest.raises(APIError) as e:
        spoken.within(SamplingParams(max_tokens=4))
    assert (e.value.status, e.value.param) == (400, "max_tokens")
    with pytest.raises(APIError):
        spoken.within(SamplingParams(max_tokens=150, min_tokens=147))
    kept, text = spoken.within(SamplingParams(max_tokens=5))
    assert (kept.speech_tokens, text.max_tokens) == (4, 1)


def chat_with(messages: list[dict[str, Any]]) -> Any:
    return parse_chat_completion_request({"model": "m", "messages": messages})


async def test_an_earlier_answer_is_recalled_as_its_transcript(setting: tuple[ServedModel, ModelAudio, LocalStore]) -> None:
    _, _, store = setting
    await store_spoken(store, "audio_abc", np.zeros(10, dtype=np.float32), "wav", "It is sunny.")
    req = chat_with([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "audio": {"id": "audio_abc"}},
        {"role": "user", "content": "And tomorrow?"},
    ])  # fmt: skip
    recalled = await recall_spoken(store, req)
    assert recalled.messages[1].content == "It is sunny."
    assert [m.content for m in recalled.messages[::2]] == ["Weather?", "And tomorrow?"]
    plain = chat_with([{"role": "user", "content": "hi"}])
    assert await recall_spoken(None, plain) is plain  # nothing to recall: the request as it is


@pytest.mark.parametrize("with_store", [True, False])
async def test_an_unknown_id_is_a_400_naming_it(setting: tuple[ServedModel, ModelAudio, LocalStore], with_store: bool) -> None:
    _, _, store = setting
    req = chat_with([{"role": "user", "content": "x"}, {"role": "assistant", "audio": {"id": "audio_gone"}}])
    with pytest.raises(APIError) as refused:
        await recall_spoken(store if with_store else None, req)
    assert (refused.value.status, refused.value.param) == (400, "messages[1].audio.id")
    assert "audio_gone" in str(refused.value)


@pytest.mark.parametrize("fields", [{}, {"audio": {"voice": "alloy", "format": "wav"}}, {"modalities": ["text"]}])
async def test_a_request_that_does_not_ask_for_audio_does_not_speak(setting: tuple[ServedModel, ModelAudio, LocalStore], fields: dict[str, Any]) -> None:
    """No modalities naming audio: no ChatAudio, whatever else the request says (`audio` alone
    asks for nothing, as on OpenAI's chat)."""
    model, audio, _ = setting
    spoken = ServedModel("m", model.tokenizer, model.pool, created=0, outputs=(audio,))
    req = parse_chat_completion_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})
    assert chat_audio(spoken, req) is None


def _piece(delta: Delta, samples: list[float], *, last: bool = False) -> None:
    AUDIO.add(delta, AudioPiece(np.asarray(samples, dtype="<f4").tobytes(), 24000, 0, last))


async def test_a_spoken_message_is_its_audio_and_transcript_kept_under_its_id(setting: tuple[ServedModel, ModelAudio, LocalStore]) -> None:
    _, audio, store = setting
    body = ChatAudio(audio, 0, "wav").body(1)
    said = Delta("", [])
    _piece(said, [0.0, 0.5], last=True)
    assert body.spoke(0, said) and not body.spoke(0, Delta("", []))
    fields = await body.message(said, "Hello.")
    message_audio = fields["audio"]
    assert isinstance(message_audio, MessageAudio) and fields["content"] is None  # the text is the transcript
    assert message_audio.transcript == "Hello." and message_audio.data == base64.b64encode(
        await store.get(f"out/audio/{message_audio.id}.wav")
    ).decode()
    assert await body.message(Delta("", []), "unspoken") == {}  # no audio: the message is left as it is


async def test_a_spoken_stream_sends_pcm16_and_the_transcript_and_keeps_the_answer_at_its_end(setting: tuple[ServedModel, ModelAudio, LocalStore]) -> None:
    _, audio, store = setting
    body = ChatAudio(audio, 0, "pcm16").body(2)
    first = Delta("Hi", [])
    _piece(first, [0.0, 0.5])
    sent = body.delta(0, first, "Hi")
    assert sent["content"] is UNSET  # the transcript takes the content's place
    chunk = sent["audio"]
    assert isinstance(chunk, AudioDelta) and (chunk.transcript, chunk.expires_at) == ("Hi", UNSET)
    assert base64.b64decode(chunk.data) == float_to_pcm16(np.asarray([0.0, 0.5], dtype="<f4"))
    assert body.delta(0, Delta("", []), "") == {}  # nothing of it in this chunk
    assert body.spoke(0, Delta("", [])) and not body.spoke(1, Delta("", []))  # choice 0 spoke before
    last = Delta("", [], finish_reason="stop")
    _piece(last, [0.25], last=True)
    end = body.delta(0, last, "")["audio"]
    assert end.id == chunk.id and end.expires_at is not UNSET and end.transcript is UNSET
    await body.finish()
    kept = await store.get(f"out/audio/{chunk.id}.json")
    assert orjson.loads(kept)["transcript"] == "Hi"  # choice 1 said nothing: nothing kept for it
