"""Spoken chat answers: whether a chat request's choices speak, in which voice and format, and
the continuation that speaks a turn's text.

Two ways audio comes out of a chat turn, as the reference model makes it:
- asked for (modalities names "audio", `audio` gives voice and format): the turn is spoken.
  The model writes its text; when the text ends (the model's end of turn, or a stop) without
  an audio span, the choice goes on with the span opened right after the text (a continuation
  request on prompt + text + <|discrete_audio_start|>: the prefix cache holds the rest), held
  to the span grammar, within what is left of max_tokens. The text is the audio's transcript.
- on its own (modalities not given): a span the model opens mid-turn is spoken in the default
  voice (or `audio.voice` when the request names one), and the turn keeps its text. Not with an
  answer format (response_format, structured outputs): its content is the format's text alone.
modalities given without "audio" bans the span's opening token.
In the reference's dialect (ChatFormat.spoken_markup) the model writes its units bare after its
speaker info, which picks the voice when the request names none (omni/modalities/outputs/audio.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import msgspec
import orjson

from omni.engines.generation import Generation, OutputOptions
from omni.errors import bad_request
from omni.modalities.outputs.audio import AUDIO, AudioRoute, ModelAudio
from omni.serving.choice_constraints import OutputSpans
from omni.serving.model import ServedModel
from omni.serving.requests import ChatCompletionRequest
from omni.shared.store.base import ArtifactStore, KeyNotFound, StoreError
from omni.shared.store.keys import validate_key
from omni.text.constrained.audio_span import MAX_UNITS, MIN_UNITS
from scheduler.request import SamplingParams

SPONTANEOUS_FORMAT = "wav"  # of an answer that spoke without being asked: no format was given


@dataclass(frozen=True, slots=True)
class ChatAudio:
    audio: ModelAudio
    voice: int
    format: str  # the non-streamed answer's audio format; a stream's is pcm16
    requested: bool  # modalities named audio: every choice's turn is spoken
    dialect: bool = False  # the reference's spoken answers: bare units after the speaker info
    voice_named: bool = True  # the request named the voice (else the model's speaker info may)

    def spans(self) -> OutputSpans | None:
        grammar = self.audio.grammar
        return None if grammar is None else OutputSpans(grammar, self.audio.format.start_token_id)

    def answer_format(self) -> ChatAudio | None:
        """Under an answer format: spoken only when modalities asks, after the text (the
        dialect's bare units in the reasoning are not spoken)."""
        return dataclasses.replace(self, dialect=False) if self.requested else None

    def route(self, model: ServedModel, choice_index: int) -> AudioRoute:
        """(Every choice speaks in the same voice.)"""
        route = self.audio.route(self.voice, dialect=self.dialect, voice_named=self.voice_named)
        if not self.requested:
            return route
        return dataclasses.replace(route, speak_after=functools.partial(speak_text, model, self.audio))


def chat_audio(model: ServedModel, req: ChatCompletionRequest) -> ChatAudio | None:
    """None when no audio can come out: the model has no audio decoder (then asking for audio
    is a 400), or modalities leaves audio out."""
    requested = "audio" in req.modalities
    audio = model.output(AUDIO)
    if audio is None:
        if requested:
            raise bad_request("This model has no audio decoder: it cannot speak.", param="modalities")
        return None
    if not req.audio_allowed:
        return None
    if requested or req.audio is not None:
        audio.check_ready()  # the voices are the ready decoder's
    if requested:
        audio.engine.check_room()
    voice = audio.voice_index(req.audio.voice, "audio.voice") if req.audio is not None else 0
    fmt = req.audio.format if req.audio is not None else SPONTANEOUS_FORMAT
    return ChatAudio(audio, voice, fmt, requested, model.chat_format.spoken_markup, req.audio is not None)


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


def speak_text(model: ServedModel, audio: ModelAudio, text: Generation) -> Generation | None:
    """The continuation that speaks a finished text: prompt + text (without the token that
    ended it) + the span's opening token, held to the span grammar; None when the context or
    max_tokens leaves no room for the span's least units."""
    request = text.request
    params = request.sampling_params
    out = request.output_token_ids
    stops = set(params.stop_token_ids) | set(request.eos_token_ids)
    said = out[:-1] if out and out[-1] in stops else out
    prompt = [*request.prompt_token_ids, *said, audio.format.start_token_id]
    room = min(params.max_tokens - len(out), model.pool.max_model_len - len(prompt))
    if room < MIN_UNITS + 1 or audio.grammar is None:
        return None
    return Generation(
        text.pool,
        text.tokenizer,
        prompt,
        continuation_params(params, min(room, MAX_UNITS + 1)),  # the units, then the span's end
        f"{request.request_id}-speech",
        output=OutputOptions(skip_special_tokens=text.output.skip_special_tokens),
        media=request.media,
        constraint=audio.grammar.new_constraint(None),  # the whole output is the span it opens
        cache_salt=request.cache_salt,  # its prompt is the turn's: kept apart as the turn is
    )


async def recall_spoken(store: ArtifactStore | None, req: ChatCompletionRequest) -> ChatCompletionRequest:
    """An assistant turn given as {"audio": {"id": ...}} (an earlier spoken answer of this
    server's, as OpenAI lets a client refer to one) gets its stored transcript as its text; an
    id the store does not have (unknown, or expired and removed) is a 400 naming it. No store
    (an app built without one, in tests) has kept no answers."""
    if not any(m.audio_id for m in req.messages):
        return req
    messages = list(req.messages)
    for i, message in enumerate(messages):
        if message.audio_id is None or message.content is not None:
            continue
        param = f"messages[{i}].audio.id"
        unknown = bad_request(f"No spoken answer has the id '{message.audio_id}' (or it expired).", param=param)
        if store is None:
            raise unknown
        try:
            meta = orjson.loads(await store.get(validate_key(f"out/audio/{message.audio_id}.json")))
        except (KeyNotFound, ValueError, orjson.JSONDecodeError):
            raise unknown from None
        except StoreError:
            raise bad_request(f"The spoken answer '{message.audio_id}' could not be read back.", param=param) from None
        messages[i] = msgspec.structs.replace(message, content=str(meta.get("transcript", "")))
    return msgspec.structs.replace(req, messages=tuple(messages))
