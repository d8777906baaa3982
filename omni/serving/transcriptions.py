"""POST /v1/audio/transcriptions without HTTP (the response:
omni/http/handlers/transcriptions.py; realtime transcribes the user's turns with it too):

    the hearing model -> gates -> the upload as a media item -> a user turn of the audio and
    an instruction -> one choice bounded by the audio's length, text only
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from omni.engines.generation import Generation, OutputOptions, new_request_id
from omni.errors import APIError, bad_request, service_unavailable
from omni.modalities.inputs.items import MediaItem, decode_params
from omni.modalities.inputs.placeholders import placeholder_ids
from omni.modalities.outputs.kinds import OUTPUT_KINDS
from omni.modalities.outputs.router import OutputRouter
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.prepared import Prepared, answer_template, check_serving
from omni.serving.requests.transcriptions import TranscriptionRequest
from omni.serving.sampling import request_priority
from omni.shared.store.keys import content_hash
from scheduler.request import SamplingParams

# The audio encoder's embedding rows per second of audio: 16 kHz samples, a 10 ms mel hop, then
# two halvings (Qwen2-Audio's stride-2 convolution and its pooling). The encoder reports rows,
# not samples, so a clip's duration is known to 1 / 25 s.
AUDIO_ROWS_PER_SECOND = 25
# A transcript's length bound: fast speech is about 5 words (7 Korean syllables) a second, a
# few tokens each. A model still writing past this is not transcribing.
TRANSCRIPT_TOKENS_PER_SECOND = 20
MIN_TRANSCRIPT_TOKENS = 32
TRANSCRIBE_INSTRUCTION = "Transcribe the audio verbatim."
_HASH_IN_THREAD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Transcription(Prepared):
    """A transcription, ready to run: its one routed output."""

    duration: float  # seconds of audio, from the encoder's rows
    num_audio_tokens: int  # the prompt tokens standing for the audio (the rest is text)

    @property
    def output(self) -> OutputRouter:
        return self.outputs[0]


async def transcription(models: ModelRegistry, req: TranscriptionRequest, *, timeout: float | None) -> Transcription:
    """A user turn of the audio and an instruction to write down what is said (the language and
    the client's prompt as hints), reasoning off, no image or audio span: the answer is the
    transcript. The upload is a media item like a chat's input_audio part, named `file`."""
    model = _hearing_model(models, req.model)
    media = model.media
    assert media is not None  # _hearing_model
    if len(req.file) > media.limits.max_bytes:
        raise APIError(
            413, f"'file' is larger than {media.limits.max_bytes} bytes (--max-media-bytes).",
            param="file", code="payload_too_large",
        )  # fmt: skip
    check_serving(model)
    if not media.ready:
        raise service_unavailable("The model's encoders are starting; retry shortly.", retry_after_s=5)
    if "audio_encoder" not in media.encoder.components:
        raise bad_request(f"The model '{model.name}' has no audio encoder: it cannot transcribe.", param="model")
    priority = request_priority(model.pool.config.llm, req.priority)
    model.pool.check_admission(priority)
    params = decode_params("audio", media.limits)
    if len(req.file) > _HASH_IN_THREAD_BYTES:
        digest = await asyncio.to_thread(content_hash, req.file, params)
    else:
        digest = content_hash(req.file, params)
    item = MediaItem("audio", "file", req.file, None, digest)  # fmt None: FFmpeg probes the container
    turn = [{"type": "audio", "id": "audio_0"}, {"type": "text", "text": transcription_instruction(req)}]
    template_ids = await asyncio.to_thread(answer_template, model, [{"role": "user", "content": turn}])
    prompt = await media.expand(template_ids, [item], priority=priority)
    placeholders = placeholder_ids(model.tokenizer)
    num_audio = len(prompt.token_ids) - sum(t not in placeholders for t in template_ids)
    duration = (prompt.media[0].num_rows if prompt.media else num_audio) / AUDIO_ROWS_PER_SECOND
    room = model.pool.max_model_len - len(prompt.token_ids)
    if room <= 0:
        raise bad_request(
            f"The audio is {duration:g} s, {num_audio} prompt tokens; with the instruction the prompt is "
            f"{len(prompt.token_ids)} tokens, which leaves no room in the model's context of "
            f"{model.pool.max_model_len}.",
            param="file",
            code="context_length_exceeded",
        )
    params_out = SamplingParams(
        max_tokens=min(room, MIN_TRANSCRIPT_TOKENS + math.ceil(TRANSCRIPT_TOKENS_PER_SECOND * duration)),
        temperature=req.temperature,
        seed=req.seed,
        # verbose_json's segment lists the tokens and their mean logprob
        logprobs=0 if req.logprobs or req.response_format == "verbose_json" else None,
        bad_words_token_ids=_span_openers(model),
        priority=priority,
    )
    generation = Generation(
        model.pool, model.tokenizer, prompt.token_ids, params_out, new_request_id("trsc"),
        output=OutputOptions(), media=prompt.media,
    )  # fmt: skip
    output = OutputRouter(generation)
    return Transcription(model=model, outputs=[output], timeout=timeout, duration=duration, num_audio_tokens=num_audio)


def transcription_instruction(req: TranscriptionRequest) -> str:
    """The user turn's text after the audio: the instruction, then the client's hints."""
    parts = [TRANSCRIBE_INSTRUCTION]
    if req.language is not None:
        parts.append(f"The speech is in the language with ISO-639-1 code '{req.language}'.")
    if req.prompt is not None:
        parts.append(f"Follow the style, spelling and words of this text, which may precede the audio: {req.prompt}")
    return " ".join(parts)


def _span_openers(model: ServedModel) -> tuple[tuple[int, ...], ...]:
    """Bad words: the opening tokens of every kind's spans the vocabulary has (decoder or not),
    so that the answer is text."""
    ids = (model.tokenizer.token_to_id(kind.start_token) for kind in OUTPUT_KINDS)
    return tuple((i,) for i in ids if i is not None)


def _hearing_model(models: ModelRegistry, name: str | None) -> ServedModel:
    """The named model, which must read audio, or the only served model that reads media."""
    return models.capable(
        name, lambda m: m.media is not None, lacks="has no audio encoder: it cannot transcribe",
        does=("reads audio", "read audio"),
    )  # fmt: skip
