"""A spoken continuation samples as its text did: every field of the text's SamplingParams
reaches it but the few the span owns (omni/modalities/outputs/audio_chat.py:SPAN_OWN)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, cast

from omni.engines.generation import Generation, OutputOptions
from omni.modalities.outputs.audio import ModelAudio
from omni.modalities.outputs.audio_chat import SPAN_OWN, ChatAudio, continuation_params, speak_text
from omni.shared import protocol
from omni.text.constrained.audio_span import MAX_UNITS
from scheduler.request import SamplingParams
from tests.omni.modalities.outputs.fake_vocoder import VOICES, FakeDecoder

# Every field at a value that is not its default, so a field that is dropped shows.
TEXT = SamplingParams(
    max_tokens=300,
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    seed=11,
    logprobs=2,
    stop_token_ids=(5, 6),
    ignore_eos=True,
    min_tokens=4,
    presence_penalty=0.5,
    frequency_penalty=-0.25,
    repetition_penalty=1.3,
    logit_bias=((7, 2.0),),
    min_p=0.05,
    priority=-3,
    allowed_token_ids=(1, 2, 3),
    bad_words_token_ids=((8, 9),),
    prompt_logprobs=1,
    speculative=False,
)


def test_the_text_params_set_every_field_off_its_default() -> None:
    default = SamplingParams(max_tokens=1)
    unset = [f.name for f in dataclasses.fields(SamplingParams) if getattr(TEXT, f.name) == getattr(default, f.name)]
    assert unset == []  # a field added to SamplingParams needs a value here


def test_every_sampling_field_but_the_spans_own_reaches_the_continuation() -> None:
    speech = continuation_params(TEXT, 21)
    assert speech.max_tokens == 21
    for f in dataclasses.fields(SamplingParams):
        if f.name == "max_tokens":
            continue
        expected = SPAN_OWN[f.name] if f.name in SPAN_OWN else getattr(TEXT, f.name)
        assert getattr(speech, f.name) == expected, f.name
    # the fields a hand-written copy dropped
    assert (speech.repetition_penalty, speech.presence_penalty, speech.frequency_penalty) == (1.3, 0.5, -0.25)
    assert speech.logit_bias == ((7, 2.0),)


def test_the_span_owns_only_token_rules_and_what_it_reports() -> None:
    """A sampling field (how tokens are drawn) is never the span's own: SPAN_OWN is the text's
    token rules and its prompt logprobs, each back at its default."""
    default = SamplingParams(max_tokens=1)
    assert set(SPAN_OWN) == {
        "stop_token_ids", "ignore_eos", "min_tokens", "allowed_token_ids", "bad_words_token_ids", "prompt_logprobs"
    }  # fmt: skip
    assert all(getattr(default, name) == value for name, value in SPAN_OWN.items())


def test_speak_text_samples_the_span_with_the_texts_params() -> None:
    """The continuation speak_text builds: prompt + text + the span's opening token, its params
    the text's (a hand-written copy once dropped repetition_penalty and the penalties)."""
    start, eos = 900, 2
    text = Generation(
        cast(Any, None), cast(Any, SimpleNamespace(eos_token_ids=frozenset({eos}))), [1, 2, 3], TEXT, "chatcmpl-1",
        output=OutputOptions(), cache_salt="salt",
    )  # fmt: skip
    text.request.output_token_ids = [40, 41, eos]
    model = SimpleNamespace(pool=SimpleNamespace(max_model_len=4096), chat_format=SimpleNamespace(reasoning_parser=None))
    audio = SimpleNamespace(format=SimpleNamespace(start_token_id=start), grammar=SimpleNamespace(new_constraint=lambda _: "span"))
    speech = speak_text(cast(Any, model), cast(Any, audio), text)
    assert speech is not None
    assert speech.request.prompt_token_ids == [1, 2, 3, 40, 41, start]  # the turn's end is not said
    assert MAX_UNITS + 1 > 297  # what is left of max_tokens bounds the span here
    assert speech.request.sampling_params == continuation_params(TEXT, 300 - 3)
    assert speech.request.sampling_params.repetition_penalty == 1.3
    assert (speech.constraint, speech.request.cache_salt) == ("span", "salt")


def test_a_spoken_turns_vocoder_streams_take_its_priority_and_a_live_sessions_mark() -> None:
    decoder = FakeDecoder(info=protocol.AudioDecoderReady(0, "cpu", 24000, 960, 64, list(VOICES), False))
    audio = SimpleNamespace(route=lambda voice, **kw: ModelAudio.route(cast(Any, SimpleNamespace(
        engine=decoder, voices=VOICES, format=None, sample_rate=24000, first_chunk_units=4, chunk_units=25)), voice, **kw))
    chat = ChatAudio(cast(Any, audio), 1, "wav")
    kept, _ = chat.within(TEXT)
    assert kept.priority == TEXT.priority == -3
    dataclasses.replace(kept, live=True).route(cast(Any, None), 0).open_stream()
    kept.route(cast(Any, None), 0).open_stream()
    assert decoder.orders == [(-3, True), (-3, False)]
