"""POST /v1/audio/speech without HTTP: the request becomes a spoken answer of the model's own
voice (or a reference recording's), prepared as the other endpoints' are (omni/serving/prepared.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from omni.engines.audio_decoder import AudioDecodeError
from omni.engines.generation import Generation, OutputOptions, new_request_id
from omni.errors import bad_request
from omni.modalities.outputs.audio import AUDIO, ModelAudio
from omni.modalities.outputs.router import OutputRouter
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.prepared import Prepared, check_serving
from omni.serving.prompt import chat_prompt
from omni.serving.requests import parse_chat_completion_request
from omni.serving.requests.speech import SpeechRequest
from omni.serving.sampling import request_priority
from omni.shared.media.audio import decode_audio
from omni.shared.media.errors import MediaError
from omni.text.constrained.audio_span import MIN_UNITS
from scheduler.request import SamplingParams

# The response: omni/http/handlers/speech.py.


@dataclass(frozen=True, slots=True, kw_only=True)
class Speech(Prepared):
    """Speech, ready to run: its one routed output, an audio span the prompt opened."""

    sample_rate: int  # of the vocoder's samples

    @property
    def output(self) -> OutputRouter:
        return self.outputs[0]


async def speech(models: ModelRegistry, req: SpeechRequest, *, timeout: float | None) -> Speech:
    """The speaking model -> prompt (the instructions as a system turn, the input as the
    user's, reasoning off) + the audio span's opening token -> one choice held to the span
    grammar (3 to max_units units, then the end), whose router sends its units to the vocoder
    in chunks as they are sampled."""
    model = _speaking_model(models, req.model)
    audio = model.output(AUDIO)
    assert audio is not None
    check_serving(model)
    audio.check_ready()
    priority = request_priority(model.pool.config.llm, req.priority, voice=True)
    model.pool.check_admission(priority)
    audio.engine.check_room()
    embedding = None
    if req.reference_audio is not None:
        embedding = await _reference_voice(model, audio, req)
        voice = 0
    else:
        voice = audio.voice_index(req.voice, "voice")
    router = await _speech_choice(model, audio, req, voice, embedding, priority)
    return Speech(model=model, outputs=[router], timeout=timeout, sample_rate=audio.sample_rate)


async def _reference_voice(model: ServedModel, audio: ModelAudio, req: SpeechRequest) -> bytes:
    """The speaker embedding of the request's reference recording (the zero-shot voice). The
    encoder's own failure is left an EngineError: a 503, as any engine's."""
    info = audio.engine.info
    if info is None or not info.speaker_encoder:
        raise bad_request("This model's voices cannot be taken from a recording (it has no speaker encoder).",
                          param="reference_audio")  # fmt: skip
    assert req.reference_audio is not None
    limits = model.pool.config.media_limits
    try:  # PyAV decodes off the event loop
        samples = await asyncio.to_thread(
            decode_audio, req.reference_audio, req.reference_format, limits, "reference_audio"
        )
    except MediaError as exc:
        raise bad_request(exc.message, param=exc.param) from None
    try:
        return await audio.engine.embed_speaker(samples.astype("<f4").tobytes(), info.speaker_sample_rate)
    except AudioDecodeError as exc:  # too short a clip, say: the client's
        raise bad_request(f"reference_audio: {exc}", param="reference_audio") from None


async def _speech_choice(
    model: ServedModel, audio: ModelAudio, req: SpeechRequest, voice: int, embedding: bytes | None, priority: int
) -> OutputRouter:
    messages = [{"role": "user", "content": req.input}]
    if req.instructions:
        messages.insert(0, {"role": "system", "content": req.instructions})
    turn = parse_chat_completion_request(
        {
            "model": model.name,
            "messages": messages,
            # the answer is the speech: templates that reason first are told not to
            "chat_template_kwargs": {"enable_thinking": False, "skip_reasoning": True},
        }
    )
    prompt = await chat_prompt(model, turn, [])
    token_ids = [*prompt.token_ids, audio.format.start_token_id]
    room = model.pool.max_model_len - len(token_ids)
    if room < MIN_UNITS + 1:
        raise bad_request(
            f"The input is {len(token_ids)} tokens; it leaves no room for speech in the model's context of "
            f"{model.pool.max_model_len}.",
            param="input",
            code="context_length_exceeded",
        )
    # The units (at most max_units: the grammar's own bound, so the last token is the span's end
    # rather than a unit the length limit cuts), then the end.
    grammar = await audio.span_grammar(model.grammars, min(req.max_units, room - 1))
    params = SamplingParams(max_tokens=min(req.max_units + 1, room), seed=req.seed, priority=priority)
    constraint = grammar.new_constraint(None)  # the whole output is the span the prompt opened
    generation = Generation(
        model.pool, model.tokenizer, token_ids, params, new_request_id("speech"),
        output=OutputOptions(), constraint=constraint,
    )  # fmt: skip
    return OutputRouter(generation, audio.route(voice, embedding=embedding, opened=True, priority=priority))


def _speaking_model(models: ModelRegistry, name: str | None) -> ServedModel:
    """The named model, which must speak, or the only served model that does."""
    return models.capable(
        name, lambda m: m.output(AUDIO) is not None, lacks="has no audio decoder: it cannot speak", does=("speaks", "speak")
    )
