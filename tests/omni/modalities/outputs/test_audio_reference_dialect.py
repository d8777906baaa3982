"""The reference model's spoken answer, as a scripted token stream (no model): the output router
with the reference's audio route, then the reply parser, streamed and whole.

    <user_transcript>U</user_transcript>\\n<assistant_transcript>A</assistant_transcript>\\n
    <audio_decoder_call><speaker_info>{json}</speaker_info><|audioNNNN|>...<|im_end|>

(the markup read from the reference's omni_tool_parser.py docstring and its chainer's
extract_audio_info / _strip_transcript_tags, OmniServe at ae0d33f). Where each part goes: the
units to the vocoder and never into the text; the speaker info picks the voice (gender m ->
mhwj) when the request names none; the assistant transcript is the content (which the chat
handler makes message.audio.transcript); the user transcript and all markup reach no client.
The legacy "\\n\\n{json}\\n\\n" speaker info is read the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from omni.engines.generation import Delta, Generation, OutputOptions
from omni.engines.pool import ModelPool
from omni.errors import APIError
from omni.modalities.outputs.audio import AUDIO, AudioRoute, speaker_info, speaker_voice
from omni.modalities.outputs.router import OutputRouter
from omni.text.constrained.audio_span import AudioSpanFormat
from omni.text.reply_parser import OutputFormat
from omni.text.tokenizer import TextTokenizer
from scheduler.request import Request, SamplingParams
from tests.omni.fake_pool import FakePool, FakeStream

VOICES = ("fkms", "mhwj", "other")
TAGGED = (
    "<user_transcript>What time is it?</user_transcript>\n"
    "<assistant_transcript>It is noon.</assistant_transcript>\n"
    '<audio_decoder_call><speaker_info>{"gender": "m", "age": "20-30"}</speaker_info>'
)
LEGACY = 'It is noon.\n\n{"gender": "f"}\n\n'
OUTPUT = OutputFormat(spoken_markup=True)  # the reference's dialect, no tools asked for


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@dataclass
class RecordedPool(FakePool):
    """The scheduler has recorded the request's tokens by the time they reach the router."""

    def submit(self, request: Request, constraint: object = None) -> FakeStream:
        request.output_token_ids[:] = self.tokens
        return super().submit(request, constraint)


class Sink:
    def __init__(self, voice: int, log: list[tuple[int, list[int]]]) -> None:
        self.voice, self.log, self.closed = voice, log, False

    async def decode(self, units: list[int], *, last: bool = False) -> bytes:
        self.log.append((self.voice, list(units)))
        return np.asarray(units, dtype="<f4").tobytes()

    def close(self) -> None:
        self.closed = True


async def run(tokenizer: TextTokenizer, text: str, units: list[int], *, voice_named: bool) -> tuple[list[Delta], list[tuple[int, list[int]]], list[Sink]]:
    """The scripted answer (text, then bare units, then <|im_end|>) through the output router."""
    fmt = AudioSpanFormat.from_tokenizer(tokenizer)
    assert fmt is not None
    log: list[tuple[int, list[int]]] = []
    sinks: list[Sink] = []

    def sink(voice: int) -> Sink:
        sinks.append(Sink(voice, log))
        return sinks[-1]

    def speaker_stream(info: Mapping[str, Any]) -> Sink | None:
        row = speaker_voice(info, VOICES)
        return None if row is None else sink(row)

    route = AudioRoute(
        fmt, lambda: sink(0), 24000, first_chunk_units=4, chunk_units=8, bare_units=True,
        speaker_stream=None if voice_named else speaker_stream,
    )  # fmt: skip
    im_end = tokenizer.token_to_id("<|im_end|>")
    assert im_end is not None
    tokens = [*tokenizer.encode(text, add_special_tokens=False), *(fmt.first_unit_id + u for u in units), im_end]
    keep = tokenizer.special_ids(*OUTPUT.markup_tokens)
    g = Generation(
        cast(ModelPool, RecordedPool(tokens, finish_reason="stop")), tokenizer, [1, 2], SamplingParams(max_tokens=64),
        "req-0", output=OutputOptions(skip_special_tokens=True, keep_special=keep),
    )  # fmt: skip
    return [d async for d in OutputRouter(g, route).deltas()], log, sinks


@pytest.mark.parametrize(("text", "voice"), [(TAGGED, 1), (LEGACY, 0)])
@pytest.mark.parametrize("voice_named", [False, True])
async def test_each_part_goes_where_it_belongs(tokenizer: TextTokenizer, text: str, voice: int, voice_named: bool) -> None:
    units = [7, 3, 0, 62, 5, 9, 11, 2, 40, 1]
    deltas, log, _ = await run(tokenizer, text, units, voice_named=voice_named)

    # the units: all to the vocoder, in order, in the voice the speaker info picked (the
    # request's own, index 0 here, when it named one), and no unit in any text
    assert [u for _, chunk in log for u in chunk] == units
    assert {v for v, _ in log} == {0 if voice_named else voice}
    assert np.concatenate([np.frombuffer(p.samples, "<f4") for d in deltas for p in AUDIO.pieces(d)]).tolist() == units
    assert "<|audio" not in "".join(d.text for d in deltas)

    # the text: only the answer, streamed and whole alike; no markup in any streamed piece
    spoke = any(AUDIO.pieces(d) for d in deltas)
    stream = OUTPUT.new_parser()
    pieces = [stream.push(d.text).content for d in deltas] + [stream.finish(spoke=spoke).content]
    whole = OUTPUT.new_parser().parse("".join(d.text for d in deltas), spoke=spoke).content
    assert "".join(pieces) == whole == "It is noon."
    assert not any(mark in piece for piece in pieces for mark in ("<", "{", "What time"))


def test_speaker_info_forms_and_voices() -> None:
    assert speaker_info(TAGGED) == {"gender": "m", "age": "20-30"}
    assert speaker_info(LEGACY) == {"gender": "f"}
    assert speaker_info("no info\n\n") is None and speaker_info("<speaker_info>{bad</speaker_info>") is None
    assert speaker_voice({"speaker": "other", "gender": "m"}, VOICES) == 2  # a voice named outright
    assert speaker_voice({"gender": "female"}, VOICES) == 0
    assert speaker_voice({"age": "20-30"}, VOICES) is None  # the age alone picks nothing
    assert speaker_voice({"gender": "m"}, ("amber", "basalt")) is None  # no such voice: the default


async def test_a_bare_span_of_fewer_than_three_units_gives_no_audio(tokenizer: TextTokenizer) -> None:
    """As the reference refuses fewer than 3 units; the stream is freed."""
    deltas, log, sinks = await run(tokenizer, TAGGED, [4, 5], voice_named=True)
    assert log == [] and not any(AUDIO.pieces(d) for d in deltas) and sinks[0].closed


async def spoken_turn(tokenizer: TextTokenizer, continuation: list[int] | None) -> tuple[list[Delta], list[tuple[int, list[int]]]]:
    """A text that ends without speaking, then (continuation not None) the spoken continuation as
    speak_text makes it in this dialect: a prompt ending with <audio_decoder_call>, its output
    the given tokens (bare units, then the end of the turn)."""
    fmt = AudioSpanFormat.from_tokenizer(tokenizer)
    assert fmt is not None and fmt.call_token_id is not None
    log: list[tuple[int, list[int]]] = []
    im_end = tokenizer.token_to_id("<|im_end|>")
    assert im_end is not None
    text = tokenizer.encode("It is noon.", add_special_tokens=False)

    def generation(tokens: list[int], prompt: list[int], rid: str) -> Generation:
        pool = cast(ModelPool, RecordedPool(tokens, finish_reason="stop"))
        return Generation(pool, tokenizer, prompt, SamplingParams(max_tokens=64), rid, output=OutputOptions())

    def speak_after(g: Generation) -> Generation | None:
        if continuation is None:
            return None  # no room left for the span
        return generation(continuation, [1, 2, *text, fmt.call_token_id], "req-0-speech")

    route = AudioRoute(fmt, lambda: Sink(0, log), 24000, bare_units=True, speak_after=speak_after)
    router = OutputRouter(generation([*text, im_end], [1, 2], "req-0"), route)
    return [d async for d in router.deltas()], log


async def test_the_forced_speech_comes_in_bare_units_after_the_call_tag(tokenizer: TextTokenizer) -> None:
    fmt = AudioSpanFormat.from_tokenizer(tokenizer)
    assert fmt is not None
    im_end = tokenizer.token_to_id("<|im_end|>")
    units = [5, 0, 30, 7]
    deltas, log = await spoken_turn(tokenizer, [*(fmt.first_unit_id + u for u in units), im_end])
    assert [u for _, chunk in log for u in chunk] == units
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["stop"]  # one end, after the speech
    assert "".join(d.text for d in deltas) == "It is noon."


@pytest.mark.parametrize(("units", "status"), [(None, 400), ([4, 5], 500)])
async def test_a_turn_asked_to_speak_that_ends_without_units_is_an_error(tokenizer: TextTokenizer, units: list[int] | None, status: int) -> None:
    """No room for the span (400, naming the context), or a continuation cut before its least
    units (500): raised in place of the last delta, never a silent answer."""
    fmt = AudioSpanFormat.from_tokenizer(tokenizer)
    assert fmt is not None
    continuation = None if units is None else [fmt.first_unit_id + u for u in units]  # cut: no end of turn
    with pytest.raises(APIError) as e:
        await spoken_turn(tokenizer, continuation)
    assert e.value.status == status
    if status == 400:
        assert (e.value.param, e.value.code) == ("messages", "context_length_exceeded")
