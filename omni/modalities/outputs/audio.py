"""A model's audio output: its vocoder engine, the grammar of its audio spans, its voices, and
how one request's spans become audio.

    ModelAudio     one per served model with an audio_decoder/: the engine, the span format,
                   the span grammar, the chunking, the voice table
    route()        one choice's AudioRoute for the output router, the request's voice bound in

Voices. The checkpoint names its voices (audio_decoder/speakers.json); a request may name one
of those, or one of OpenAI's voice names, which map onto the checkpoint's in this fixed order,
round robin (a checkpoint with four voices a, b, c, d: alloy -> a, ash -> b, ballad -> c,
coral -> d, echo -> a, ...). Any other name is a 400 listing both. OPENAI_VOICES is the order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import numpy as np
import orjson

from omni.errors import bad_request, service_unavailable
from omni.engines.audio_decoder import AudioDecoderEngine
from omni.text.constrained.audio_span import AudioSpanFormat
from omni.text.constrained.compiler import CompiledGrammar, GrammarCompiler
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.shared.media.audio_encoding import MEDIA_TYPES, encode_audio
from omni.modalities.outputs.router import AudioRoute
from omni.shared.store.base import ArtifactStore
from omni.shared.store.keys import validate_key
from omni.text.tokenizer import TextTokenizer

OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar",
)  # fmt: skip
DEFAULT_VOICE = "alloy"
SAMPLE_RATE = 24000  # the vocoder's output (the reference's); AudioDecoderReady says it
AUDIO_EXPIRES_S = 3600  # how long a spoken answer's id may be referred to (its stored file kept)
FIRST_CHUNK_UNITS = 4  # 160 ms of speech before the first audio is sent
CHUNK_UNITS = 25  # then a second at a time


class ModelAudio:
    def __init__(
        self,
        engine: AudioDecoderEngine,
        fmt: AudioSpanFormat,
        *,
        first_chunk_units: int = FIRST_CHUNK_UNITS,
        chunk_units: int = CHUNK_UNITS,
    ) -> None:
        self.engine = engine
        self.format = fmt
        self.first_chunk_units = first_chunk_units
        self.chunk_units = chunk_units
        self.grammar: CompiledGrammar | None = None  # compiled by prepare()

    @classmethod
    def for_model(cls, engine: AudioDecoderEngine, tokenizer: TextTokenizer, **chunking: int) -> ModelAudio:
        fmt = AudioSpanFormat.from_tokenizer(tokenizer)
        if fmt is None:
            raise ValueError(
                "the model has an audio decoder, but its vocabulary lacks the audio span tokens "
                "(<|discrete_audio_start|>, <|discrete_audio_end|>, <|audioNNNN|> units)"
            )
        return cls(engine, fmt, **chunking)

    async def prepare(self, compiler: GrammarCompiler) -> None:
        """Compile the span grammar (once, off the event loop)."""
        self.grammar = await self.span_grammar(compiler, self.format.max_units)

    async def span_grammar(self, compiler: GrammarCompiler, max_units: int) -> CompiledGrammar:
        """The span grammar with at most max_units units (the compiler keeps each it compiled)."""
        fmt = dataclasses.replace(self.format, max_units=max_units)
        return await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, fmt.grammar(), "audio"))

    @property
    def ready(self) -> bool:
        return self.engine.ready

    @property
    def voices(self) -> tuple[str, ...]:
        info = self.engine.info
        return tuple(info.speakers) if info is not None else ()

    @property
    def sample_rate(self) -> int:
        info = self.engine.info
        return info.sample_rate if info is not None else 24000

    def check_ready(self) -> None:
        if not self.engine.ready:
            raise service_unavailable("The audio decoder is starting; retry shortly.", retry_after_s=5)

    def voice_index(self, name: str, param: str) -> int:
        """The speaker table's row for a voice name (the checkpoint's, or OpenAI's mapped)."""
        voices = self.voices
        if name in voices:
            return voices.index(name)
        if name in OPENAI_VOICES and voices:
            return OPENAI_VOICES.index(name) % len(voices)
        raise bad_request(
            f"Unknown voice {name!r}. This model's voices are {', '.join(voices)}; OpenAI's names "
            f"({', '.join(OPENAI_VOICES)}) map onto them.",
            param=param,
            code="invalid_value",
        )

    def route(self, voice: int, *, embedding: bytes | None = None, opened: bool = False) -> AudioRoute:
        """One choice's route: each span it opens gets a vocoder stream in this voice (a row of
        the table, or a speaker embedding taken from a recording)."""
        engine = self.engine
        return AudioRoute(
            self.format,
            lambda: engine.open_stream(voice, embedding),
            self.sample_rate,
            first_chunk_units=self.first_chunk_units,
            chunk_units=self.chunk_units,
            opened=opened,
        )


def new_audio_id() -> str:
    return f"audio_{uuid.uuid4().hex}"


async def store_spoken(store: ArtifactStore, audio_id: str, samples: np.ndarray, fmt: str, transcript: str) -> bytes:
    """Encode a spoken answer (off the event loop) and keep it in the artifact store under
    out/audio/<id>.<ext>, its transcript beside it (<id>.json); the encoded bytes."""
    data = await asyncio.to_thread(encode_audio, samples, SAMPLE_RATE, fmt)
    ext = "pcm" if fmt in ("pcm", "pcm16") else fmt
    await store.put(validate_key(f"out/audio/{audio_id}.{ext}"), data, MEDIA_TYPES[fmt])
    meta = orjson.dumps({"id": audio_id, "format": fmt, "transcript": transcript})
    await store.put(validate_key(f"out/audio/{audio_id}.json"), meta, "application/json")
    return data
