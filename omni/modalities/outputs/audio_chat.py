"""The audio's chat side (omni/modalities/outputs/chat_output.py), spoken chat answers: whether a
chat request's choices speak, in which voice and format, the continuation that speaks a turn's
text, and the spoken answer in the body.

Audio comes out of a chat turn only when asked for, as OpenAI's chat answers: modalities names
"audio", and `audio` gives the voice and format. The turn is spoken: the model writes its text
(or its units, in the reference's dialect: ChatFormat.spoken_markup, bare units after its
speaker info); when the text ends without an audio span, the choice goes on with the span
opened right after the text (a continuation request on prompt + text + <|discrete_audio_start|>:
the prefix cache holds the rest), held to the span grammar, within what is left of max_tokens.
The text is the audio's transcript. The text leaves room in max_tokens for its speech
(ChatAudio.within): a text that runs to its share is cut ("length") and spoken all the same.
A request that does not ask for audio cannot open the span (its opening token is banned; the
dialect's bare units, special tokens, are no audio and no text), and no span is opened inside
the reasoning (choice_constraints holds the openers back).

In the body, OpenAI's shape: a non-streamed turn's message.audio holds the audio in the asked
format (base64 of the file), its id and the transcript, and the message has no content; a
stream's chunks carry delta.audio (base64 PCM16 of the samples each completed, the transcript in
place of delta.content). Each answer is kept in the artifact store under its id (store_spoken),
so a later turn can refer to it (omni/serving/prompt.py recall_spoken).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np
from msgspec import UNSET, Struct, UnsetType

from omni.engines.generation import Delta, Generation, OutputOptions
from omni.errors import bad_request
from omni.modalities.outputs.audio import (
    AUDIO,
    AUDIO_EXPIRES_S,
    AudioPiece,
    AudioRoute,
    ModelAudio,
    new_audio_id,
    store_spoken,
)
from omni.modalities.outputs.chat_output import ChatModel
from omni.modalities.outputs.kind import Carrier, OutputSpans
from omni.shared.media.audio_encoding import float_to_pcm16
from omni.text.constrained.audio_span import MAX_UNITS, MIN_UNITS
from omni.text.parsers.reasoning import prompt_opens_reasoning, reasoning_parser_class
from scheduler.request import SamplingParams


class MessageAudio(Struct):
    """A spoken turn's audio: the file in audio.format, base64, stored under id until expires_at."""

    id: str
    data: str
    expires_at: int
    transcript: str


class AudioDelta(Struct, kw_only=True):
    """A streamed spoken turn's audio: base64 PCM16 of the samples this chunk completed, the
    transcript (the turn's text), and expires_at on the last."""

    data: str | UnsetType = UNSET
    transcript: str | UnsetType = UNSET
    expires_at: int | UnsetType = UNSET
    id: str


class AudioOptions(Protocol):
    """A chat request's `audio` object (omni/serving/requests/chat.py AudioOutput)."""

    @property
    def voice(self) -> str: ...
    @property
    def format(self) -> str: ...


class AudioRequest(Protocol):
    """What the audio's chat side reads of a chat request (omni/serving/requests/chat.py)."""

    @property
    def modalities(self) -> tuple[str, ...]: ...
    @property
    def audio(self) -> AudioOptions | None: ...


@dataclass(frozen=True, slots=True)
class ChatAudio:
    """How a chat request that asks for audio speaks: every choice's turn is spoken."""

    audio: ModelAudio
    voice: int
    format: str  # the non-streamed answer's audio format; a stream's is pcm16
    dialect: bool = False  # the reference's spoken answers: bare units after the speaker info
    speech_tokens: int = 0  # of max_tokens, kept from the text for its speech (within)
    priority: int = 0  # the turn's (within): the vocoder's order
    live: bool = False  # a realtime session's turn: its vocoder streams go before other speech

    def spans(self) -> OutputSpans | None:
        grammar = self.audio.grammar
        if grammar is None:
            return None
        fmt = self.audio.format
        bare = frozenset(range(fmt.first_unit_id, fmt.first_unit_id + fmt.num_units)) if self.dialect else frozenset()
        return OutputSpans(grammar, fmt.start_token_id, bare_openers=bare)

    def answer_format(self) -> ChatAudio | None:
        """Under an answer format: spoken after the text (the dialect's bare units are not
        spoken: the content is the format's text alone)."""
        return dataclasses.replace(self, dialect=False)

    def route(self, model: ChatModel, choice_index: int) -> AudioRoute:
        """(Every choice speaks in the same voice: the request names it.)"""
        route = self.audio.route(self.voice, dialect=self.dialect, priority=self.priority, live=self.live)
        speak = functools.partial(speak_text, model, self.audio, speech_tokens=self.speech_tokens, dialect=self.dialect)
        return dataclasses.replace(route, speak_after=speak)

    def with_previews(self, partial_images: int, previews: asyncio.Queue[Any]) -> ChatAudio:
        return self  # speech has no previews: its chunks stream as they are made

    def call_rules(self) -> tuple[str, ...]:
        return ()  # no tool takes speech as its argument

    def body(self, choices: int) -> SpokenBody:
        return SpokenBody(self.audio, self.format, choices)

    def within(self, params: SamplingParams) -> tuple[ChatAudio, SamplingParams]:
        """The turn's text params, with speech_room(max_tokens) of them kept for the speech; a
        400 when max_tokens (less min_tokens) could never hold the least span: asked for, audio
        comes or the turn is an error, never a silent answer."""
        room = speech_room(params.max_tokens, params.min_tokens)
        if room == 0:
            raise bad_request(
                f"max_tokens {params.max_tokens} leaves no room for the spoken answer: audio takes at "
                f"least {MIN_UNITS + 1} tokens after the text's {max(params.min_tokens, 1)}.",
                param="max_tokens",
            )
        text = dataclasses.replace(params, max_tokens=params.max_tokens - room)
        return dataclasses.replace(self, speech_tokens=room, priority=params.priority), text


# Speech takes far more tokens than its text: the reference speaks 25 units a second, and a
# second of speech says about three tokens of text.
UNITS_PER_TEXT_TOKEN = 8


def speech_room(max_tokens: int, min_tokens: int = 0) -> int:
    """Of a spoken turn's max_tokens, those its text may not take, so that its speech comes
    within max_tokens even when the text would run on (random weights rarely end it): the text
    gets a (1 + UNITS_PER_TEXT_TOKEN)th, the speech the rest, up to the span's most units; the
    text keeps at least one token and its min_tokens. 0 when the rest could not hold the least
    span: then the text has it all, and speaks only if it ends with room left."""
    text = max(max_tokens // (1 + UNITS_PER_TEXT_TOKEN), max_tokens - (MAX_UNITS + 1), min_tokens, 1)
    room = max_tokens - text
    return room if room >= MIN_UNITS + 1 else 0


def chat_audio(model: ChatModel, req: AudioRequest) -> ChatAudio | None:
    """None when the request does not ask for audio (modalities leaves it out; `audio` alone
    asks for nothing, as on OpenAI's chat). Asking a model with no audio decoder is a 400."""
    if "audio" not in req.modalities:
        return None
    audio = model.output(AUDIO)
    if audio is None:
        raise bad_request("This model has no audio decoder: it cannot speak.", param="modalities")
    assert req.audio is not None  # modalities with audio needs it (omni/serving/requests/chat.py)
    audio.check_ready()  # the voices are the ready decoder's
    audio.engine.check_room()
    voice = audio.voice_index(req.audio.voice, "audio.voice")
    return ChatAudio(audio, voice, req.audio.format, model.chat_format.spoken_markup)


# What a spoken continuation does not take from its text's params: the text's token rules are
# about text, and the span grammar decides which tokens the span may hold and where it ends (a
# list of allowed text ids would leave the grammar nothing; the text's stops and min_tokens
# would cut or hold the span); its prompt logprobs are not reported, and asking for them would
# keep the continuation from the prefix cache that holds its prompt.
SPAN_OWN: Mapping[str, Any] = MappingProxyType(
    {
        "stop_token_ids": (),
        "ignore_eos": False,
        "min_tokens": 0,
        "allowed_token_ids": None,
        "bad_words_token_ids": (),
        "prompt_logprobs": None,
    }
)


def continuation_params(params: SamplingParams, max_tokens: int) -> SamplingParams:
    """The text's params, less SPAN_OWN, for max_tokens of span: everything that shapes the
    sampling (temperature, top_p, top_k, min_p, the penalties, logit_bias, seed, logprobs, and a
    field added later) carries over, so the speech is sampled as the text was."""
    return dataclasses.replace(params, max_tokens=max_tokens, **SPAN_OWN)


def speak_text(
    model: ChatModel, audio: ModelAudio, text: Generation, *, speech_tokens: int = 0, dialect: bool = False
) -> Generation | None:
    """The continuation that speaks a finished text: prompt + text (without the token that
    ended it; a reasoning block the text left open is closed) + the span's opening, held to the
    span's grammar, within the text's max_tokens and the speech_tokens kept for it; None when
    the context or max_tokens leaves no room for the span's least units.

    The opening is the dialect's: ours, <|discrete_audio_start|> and the span grammar (units, then
    its end marker); the reference's, its transcript closed when the text left it open, then
    <audio_decoder_call> and bare units that the end of the turn ends (the reference's
    chainer reads its answers so: docs/REFERENCE_DIALECT.md)."""
    request = text.request
    params = request.sampling_params
    out = request.output_token_ids
    stops = set(params.stop_token_ids) | set(request.eos_token_ids)
    said = out[:-1] if out and out[-1] in stops else out
    prompt = [*request.prompt_token_ids, *said, *_reasoning_end(model, request.prompt_token_ids, said)]
    fmt = audio.format
    grammar = audio.grammar
    span_params = params
    if dialect and fmt.call_token_id is not None and audio.bare_grammar is not None:
        prompt += [*_transcript_end(model, said), fmt.call_token_id]
        grammar = audio.bare_grammar
        # The end of the turn ends this span, as its own end marker ends ours: a bias the text
        # put on the turn's end (to end the text soon) is not the speech's, which ours never sees.
        bias = tuple((t, b) for t, b in params.logit_bias if t not in request.eos_token_ids)
        span_params = dataclasses.replace(params, logit_bias=bias)
    else:
        prompt.append(fmt.start_token_id)
    room = min(params.max_tokens + speech_tokens - len(out), model.pool.max_model_len - len(prompt))
    if room < MIN_UNITS + 1 or grammar is None:
        return None
    return Generation(
        text.pool,
        text.tokenizer,
        prompt,
        continuation_params(span_params, min(room, MAX_UNITS + 1)),  # the units, then the span's end
        f"{request.request_id}-speech",
        output=OutputOptions(skip_special_tokens=text.output.skip_special_tokens),
        media=request.media,
        constraint=grammar.new_constraint(None),  # the whole output is the span it opens
        cache_salt=request.cache_salt,  # its prompt is the turn's: kept apart as the turn is
    )


def _transcript_end(model: ChatModel, said: list[int]) -> list[int]:
    """The reference dialect's </assistant_transcript>, when the text opened its transcript and
    did not close it: the speech follows the transcript, as the model writes it."""
    start, end = (
        model.tokenizer.token_to_id("<assistant_transcript>"),
        model.tokenizer.token_to_id("</assistant_transcript>"),
    )
    if start is None or end is None or start not in said:
        return []
    opened = len(said) - 1 - said[::-1].index(start)
    return [] if end in said[opened:] else [end]


def _reasoning_end(model: ChatModel, prompt: list[int], said: list[int]) -> list[int]:
    """The token that ends the reasoning, when the text was cut inside it (the speech is the
    answer, not the reasoning); none when it is closed or the model reasons in no block."""
    parser = model.chat_format.reasoning_parser
    if parser is None:
        return []
    cls = reasoning_parser_class(parser)
    start, end = model.tokenizer.token_to_id(cls.start), model.tokenizer.token_to_id(cls.end)
    if end is None or end in said:
        return []
    opened = start in said or prompt_opens_reasoning(model.tokenizer, parser, prompt)
    return [end] if opened else []


@dataclass(slots=True)
class SpokenBody:
    """Spoken answers in one chat response's body. A stream's choices each get their audio id
    at the start, and their audio is kept once the stream ends; a non-streamed message's is kept
    as it is made."""

    audio: ModelAudio
    format: str  # the non-streamed answer's; a stream's is pcm16 (and kept as wav)
    choices: int
    _ids: list[str] = field(init=False)
    _pieces: list[list[AudioPiece]] = field(init=False)  # each choice's audio so far, streamed
    _transcripts: list[list[str]] = field(init=False)

    def __post_init__(self) -> None:
        self._ids = [new_audio_id() for _ in range(self.choices)]
        self._pieces = [[] for _ in range(self.choices)]
        self._transcripts = [[] for _ in range(self.choices)]

    def spoke(self, index: int, carrier: Carrier) -> bool:
        return bool(self._pieces[index] or AUDIO.pieces(carrier))

    def parts(self, carrier: Carrier) -> list[Any]:
        return []

    async def message(self, carrier: Carrier, text: str) -> dict[str, Any]:
        """message.audio: the audio in the asked format (base64 of the file's bytes), stored
        under its id; the text is its transcript, and the message has no content, as OpenAI
        answers."""
        pieces = AUDIO.pieces(carrier)
        if not pieces:
            return {}
        audio_id = new_audio_id()
        data = await store_spoken(self.audio.store, audio_id, _samples(pieces), self.format, text)
        expires_at = int(time.time()) + AUDIO_EXPIRES_S
        return {"audio": MessageAudio(audio_id, base64.b64encode(data).decode(), expires_at, text), "content": None}

    def delta(self, index: int, delta: Delta, content: str) -> dict[str, Any]:
        """delta.audio (OpenAI's shape): the id, base64 PCM16 of the samples this delta
        completed, the transcript (a spoken turn's text, which then leaves content), and
        expires_at on the last; none when it has none of them."""
        self._transcripts[index].append(content)
        pieces = AUDIO.pieces(delta)
        self._pieces[index].extend(pieces)
        audio = AudioDelta(id=self._ids[index])
        if pieces:
            audio.data = base64.b64encode(float_to_pcm16(_samples(pieces))).decode()
        if content:
            audio.transcript = content
        some = audio.data is not UNSET or audio.transcript is not UNSET
        if delta.finish_reason is not None:
            audio.expires_at = int(time.time()) + AUDIO_EXPIRES_S
            some = True
        if not some:
            return {}
        return {"audio": audio, "content": UNSET} if content else {"audio": audio}

    async def finish(self) -> None:
        """Each choice's streamed audio is kept, so a later turn can refer to it by its id."""
        for audio_id, pieces, said in zip(self._ids, self._pieces, self._transcripts, strict=True):
            if pieces:
                await store_spoken(self.audio.store, audio_id, _samples(pieces), "wav", "".join(said))

    def count(self, carrier: Carrier) -> None:
        return None

    def usage(self) -> dict[str, Any]:
        return {}


def _samples(pieces: list[AudioPiece]) -> np.ndarray:
    return np.concatenate([np.frombuffer(p.samples, dtype="<f4") for p in pieces])
