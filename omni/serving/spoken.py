"""Spoken chat answers: whether a chat request's choices speak, in which voice and format, and
the continuation that speaks a turn's text.

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
from omni.serving.choice_constraints import OutputSpans, prompt_opens_reasoning
from omni.serving.model import ServedModel
from omni.serving.requests import ChatCompletionRequest
from omni.shared.store.base import ArtifactStore, KeyNotFound, StoreError
from omni.shared.store.keys import validate_key
from omni.text.constrained.audio_span import MAX_UNITS, MIN_UNITS
from omni.text.parsers.reasoning import reasoning_parser_class
from scheduler.request import SamplingParams


@dataclass(frozen=True, slots=True)
class ChatAudio:
    """How a chat request that asks for audio speaks: every choice's turn is spoken."""

    audio: ModelAudio
    voice: int
    format: str  # the non-streamed answer's audio format; a stream's is pcm16
    dialect: bool = False  # the reference's spoken answers: bare units after the speaker info
    speech_tokens: int = 0  # of max_tokens, kept from the text for its speech (within)

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

    def route(self, model: ServedModel, choice_index: int) -> AudioRoute:
        """(Every choice speaks in the same voice: the request names it.)"""
        route = self.audio.route(self.voice, dialect=self.dialect)
        speak = functools.partial(speak_text, model, self.audio, speech_tokens=self.speech_tokens)
        return dataclasses.replace(route, speak_after=speak)

    def within(self, params: SamplingParams) -> tuple[ChatAudio, SamplingParams]:
        """The turn's text params, with speech_room(max_tokens) of them kept for the speech."""
        room = speech_room(params.max_tokens, params.min_tokens)
        text = dataclasses.replace(params, max_tokens=params.max_tokens - room)
        return dataclasses.replace(self, speech_tokens=room), text


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


def chat_audio(model: ServedModel, req: ChatCompletionRequest) -> ChatAudio | None:
    """None when the request does not ask for audio (modalities leaves it out; `audio` alone
    asks for nothing, as on OpenAI's chat). Asking a model with no audio decoder is a 400."""
    if "audio" not in req.modalities:
        return None
    audio = model.output(AUDIO)
    if audio is None:
        raise bad_request("This model has no audio decoder: it cannot speak.", param="modalities")
    assert req.audio is not None  # modalities with audio needs it (parse_chat_completion_request)
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


def speak_text(model: ServedModel, audio: ModelAudio, text: Generation, *, speech_tokens: int = 0) -> Generation | None:
    """The continuation that speaks a finished text: prompt + text (without the token that
    ended it; a reasoning block the text left open is closed) + the span's opening token, held
    to the span grammar, within the text's max_tokens and the speech_tokens kept for it; None
    when the context or max_tokens leaves no room for the span's least units."""
    request = text.request
    params = request.sampling_params
    out = request.output_token_ids
    stops = set(params.stop_token_ids) | set(request.eos_token_ids)
    said = out[:-1] if out and out[-1] in stops else out
    prompt = [*request.prompt_token_ids, *said, *_reasoning_end(model, request.prompt_token_ids, said)]
    prompt.append(audio.format.start_token_id)
    room = min(params.max_tokens + speech_tokens - len(out), model.pool.max_model_len - len(prompt))
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


def _reasoning_end(model: ServedModel, prompt: list[int], said: list[int]) -> list[int]:
    """The token that ends the reasoning, when the text was cut inside it (the speech is the
    answer, not the reasoning); none when it is closed or the model reasons in no block."""
    parser = model.chat_format.reasoning_parser
    if parser is None:
        return []
    cls = reasoning_parser_class(parser)
    start, end = model.tokenizer.token_to_id(cls.start), model.tokenizer.token_to_id(cls.end)
    if end is None or end in said:
        return []
    opened = start in said or prompt_opens_reasoning(model, parser, prompt)
    return [end] if opened else []


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
