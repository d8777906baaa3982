"""A model's audio output: its vocoder engine, the grammar of its audio spans, its voices, and
how one request's spans become audio.

    ModelAudio     one per served model with an audio_decoder/: the engine, the span format,
                   the span grammar, the chunking, the voice table, the store spoken answers go to
    AudioRoute     one choice's audio spans for the output router (ModelAudio.route(), the
                   request's voice bound in): units -> vocoder chunks
    AUDIO          the kind (omni/modalities/outputs/kind.py): AudioPiece pieces

Voices. The checkpoint names its voices (audio_decoder/speakers.json); a request may name one
of those, or one of OpenAI's voice names, which map onto the checkpoint's in this fixed order,
round robin (a checkpoint with four voices a, b, c, d: alloy -> a, ash -> b, ballad -> c,
coral -> d, echo -> a, ...). Any other name is a 400 listing both. OPENAI_VOICES is the order.

The reference's dialect. Its model writes a spoken answer's units bare, with no opening token,
after `<speaker_info>{json}</speaker_info>` (or, older, "\n\n{json}\n\n"): a route made with
bare_units opens a span at a unit outside one, and that span ends at the first token that is no
unit. When the request names no voice, the speaker info before a span picks it (speaker_voice):
a "speaker" (or "id") naming one of the checkpoint's voices is that voice; otherwise the gender
does, as the reference's chainer maps it: "m"/"male" -> mhwj, "f"/"female" -> fkms, when the
checkpoint has that voice. The age picks nothing (the reference maps it only through a
deployment's own speaker file, not in the download), nor does "is_ref_audio" (the reference then
clones the user's last recording, which chat does not do here): the default voice speaks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import orjson

from omni.config import ModelConfig
from omni.engines.audio_decoder import AudioDecoderEngine
from omni.engines.generation import Delta, Generation
from omni.engines.supervisor import SupervisedWorker
from omni.engines.worker_specs import audio_decoder_worker_spec
from omni.errors import APIError, bad_request, internal_error, service_unavailable
from omni.metrics import Metrics
from omni.modalities.outputs.kind import OutputKind
from omni.shared.media.audio_encoding import MEDIA_TYPES, encode_audio
from omni.shared.store.base import ArtifactStore
from omni.shared.store.keys import validate_key
from omni.text.constrained.audio_span import START, AudioSpanFormat
from omni.text.constrained.compiler import CompiledGrammar, GrammarCompiler
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.tokenizer import TextTokenizer

OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar",
)  # fmt: skip
DEFAULT_VOICE = "alloy"
SAMPLE_RATE = 24000  # the vocoder's output (the reference's); AudioDecoderReady says it
AUDIO_EXPIRES_S = 3600  # how long a spoken answer's id may be referred to (its stored file kept)
FIRST_CHUNK_UNITS = 4  # 160 ms of speech before the first audio is sent
CHUNK_UNITS = 25  # then a second at a time

log = logging.getLogger("omni.modalities.outputs.audio")

# The reference's speaker info before a span's units: the tagged form, or the older flat JSON
# after a blank line at the very end of the text (markup a route never sees may follow it).
_SPEAKER_TAG = re.compile(r"<speaker_info>(\{[^{}]*\})</speaker_info>")
_SPEAKER_LEGACY = re.compile(r"\n\n(\{[^{}]+\})$")
_AFTER_INFO = re.compile(r"(?:\s|<discrete_audio>|<audio_decoder_call>)+$")
# The reference chainer's voice for a gender (omni_chainer track_b: VoiceType).
_GENDER_VOICES = {"m": "mhwj", "male": "mhwj", "f": "fkms", "female": "fkms"}


def speaker_info(text: str) -> dict[str, Any] | None:
    """The speaker info in the text before a span (the last tagged one, or the older form at its
    end), if any."""
    tagged = _SPEAKER_TAG.findall(text)
    if tagged:
        found = tagged[-1]
    else:
        legacy = _SPEAKER_LEGACY.search(_AFTER_INFO.sub("", text))
        if legacy is None:
            return None
        found = legacy.group(1)
    try:
        info = json.loads(found)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def speaker_voice(info: Mapping[str, Any], voices: Sequence[str]) -> int | None:
    """The row of the checkpoint's voice table the model's speaker info picks, if any."""
    for key in ("speaker", "id"):
        named = info.get(key)
        if isinstance(named, str) and named in voices:
            return voices.index(named)
    voice = _GENDER_VOICES.get(str(info.get("gender", "")).lower())
    return voices.index(voice) if voice in voices else None


@dataclass(frozen=True, slots=True)
class AudioPiece:
    """Audio decoded on a Delta: the next chunk of one audio span, float32 mono samples (little
    endian). A span's pieces, concatenated, are its whole audio; `last` ends the span."""

    samples: bytes
    sample_rate: int
    span: int  # which audio span of the choice, from 0
    last: bool = False


class AudioSink(Protocol):
    """One audio span's way to the vocoder (omni/engines/audio_decoder.py AudioStream)."""

    async def decode(self, units: list[int], *, last: bool = False) -> bytes: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class AudioRoute:
    """One choice's audio spans (a SpanRoute, omni/modalities/outputs/router.py): the span format, a
    way to open a vocoder stream per span (the request's voice bound in), and the chunking.

    A span's units go to the vocoder in chunks as they are sampled: a small first chunk
    (first_chunk_units) so sound starts early, then chunks twice the size of the last, up to
    chunk_units, the rest at the span's end. Each decoded chunk rides on the Delta whose token
    completed it. A span the request's end cuts short still gives the audio of the units it
    has, when there are at least the span's least units.

    opened: the prompt ends with the span's opening token (the speech API forces the span)."""

    format: AudioSpanFormat
    open_stream: Callable[[], AudioSink]
    sample_rate: int
    first_chunk_units: int = FIRST_CHUNK_UNITS
    chunk_units: int = CHUNK_UNITS
    opened: bool = False
    # Audio asked for (chat modalities with "audio"): a choice whose text ends ("stop") without
    # an audio span goes on to speak it; this makes that continuation, the audio span opened
    # after the text, or None when no room is left for it.
    speak_after: Callable[[Generation], Generation | None] | None = None
    # The reference's dialect: a unit outside a span opens one (which the first non-unit ends).
    bare_units: bool = False
    # No voice named by the request: the speaker info the model wrote before a span picks its
    # stream (None: it picks none, open_stream's voice speaks).
    speaker_stream: Callable[[Mapping[str, Any]], AudioSink | None] | None = None
    _spans: int = field(default=0, init=False)  # spans that gave audio so far
    _samples: int = field(default=0, init=False)  # bytes of samples the vocoder gave, all spans
    _opened: int = field(default=0, init=False)  # spans opened so far, audio or not
    _opening_unit: int | None = field(default=None, init=False)  # the unit that opened a bare span
    _by_token: bool = field(default=False, init=False)  # opens() claimed a token (else the prompt opened it)
    _bare: bool = field(default=False, init=False)  # the open span was opened by a unit
    _sink: AudioSink | None = field(default=None, init=False)  # the open span's stream
    _pending: list[int] = field(default_factory=list, init=False)  # units sampled, not yet sent
    _sent: int = field(default=0, init=False)  # units already decoded
    _last_chunk: int = field(default=0, init=False)  # units of the chunk sent last
    _request_id: str = field(default="", init=False)  # the request writing the span, for logs
    _no_room: bool = field(default=False, init=False)  # speak_after found no room for the span

    def opens(self, token_id: int) -> bool:
        if token_id == self.format.start_token_id:
            self._opening_unit, self._by_token = None, True
            return True
        if self.bare_units:
            self._opening_unit = self.format.unit_of(token_id)
            self._by_token = self._opening_unit is not None
            return self._by_token
        return False

    def open(self, generation: Generation) -> None:
        self._sink = self._stream_for(generation)
        self._opened += 1
        # Bare: opened by a unit, or by a prompt that ends with the dialect's call tag, not the
        # opening token (speak_after's continuation in the reference dialect): no end marker.
        by_prompt, self._by_token = not self._by_token, False
        prompt = generation.request.prompt_token_ids
        self._bare = self._opening_unit is not None or (
            self.bare_units and by_prompt and prompt[-1:] != [self.format.start_token_id]
        )
        self._pending = [] if self._opening_unit is None else [self._opening_unit]
        self._sent, self._last_chunk, self._opening_unit = 0, 0, None
        self._request_id = str(generation.request.request_id)

    def _stream_for(self, generation: Generation) -> AudioSink:
        if self.speaker_stream is not None:
            info = speaker_info(self._text_before_span(generation))
            stream = None if info is None else self.speaker_stream(info)
            if stream is not None:
                return stream
        return self.open_stream()

    def _text_before_span(self, generation: Generation) -> str:
        """The text the model wrote between the previous span (or its start) and this one."""
        ids = generation.request.output_token_ids
        fmt = self.format
        runs = 0  # spans found so far in the output
        start = 0  # where the text before the next span starts
        i = 0
        while i < len(ids):
            if ids[i] == fmt.start_token_id or fmt.unit_of(ids[i]) is not None:
                if runs == self._opened:
                    return generation.tokenizer.decode(ids[start:i], skip_special_tokens=False)
                runs += 1
                i += 1
                while i < len(ids) and fmt.unit_of(ids[i]) is not None:
                    i += 1
                start = i
                continue
            i += 1
        return ""

    async def feed(self, delta: Delta, token_id: int) -> bool:
        """A token inside the span: a unit (sent once a chunk is full) or the span's end."""
        if token_id == self.format.end_token_id:
            await self.end(delta, cut=False)
            return True
        unit = self.format.unit_of(token_id)
        if unit is None and self._bare:  # a bare span ends at the first token after its units
            await self.end(delta, cut=True)
            return True
        if unit is None:  # the span grammar lets only units and the end through
            log.error("%s: token %d inside an audio span is no unit", self._request_id, token_id)
            return False
        self._pending.append(unit)
        # The first chunk waits for the span's least units, so a span cut short before it has
        # them (no audio) never sent any. Then each chunk is twice the last, up to chunk_units
        # (4, 8, 16, 25, 25, ...): a player that starts at the first chunk has the next one
        # before the first has played out.
        if self._sent == 0:
            size = max(self.first_chunk_units, self.format.min_units)
        else:
            size = min(self.chunk_units, 2 * self._last_chunk)
        if len(self._pending) >= size:
            units, self._pending = self._pending, []
            await self._send(delta, units, last=False)
        return False

    async def end(self, delta: Delta, *, cut: bool) -> None:
        """The span ended (its end token, or the request's end cutting it short): its last
        chunk; a cut span of fewer than the least units gives no audio."""
        assert self._sink is not None
        if cut and self._sent + len(self._pending) < self.format.min_units:
            self._sink.close()  # no audio: no span (a stray bare unit does not stop speak_after)
        else:
            await self._send(delta, self._pending, last=True)
            self._spans += 1
        self._sink, self._pending = None, []

    def close(self) -> None:
        if self._sink is not None:  # the vocoder frees the stream's state
            self._sink.close()
            self._sink = None

    def after(self, generation: Generation) -> Generation | None:
        """The continuation that speaks the text, when audio was asked for and none came out."""
        if self.speak_after is None or self._samples > 0:
            return None
        spoken = self.speak_after(generation)
        self._no_room = spoken is None
        return spoken

    def missing(self) -> APIError | None:
        """Audio was asked for (speak_after) and the choice ended without any: an error, never
        a silent answer. No room left in the context for the span is the client's (400, as a
        prompt too long is); a spoken continuation that gave no units is the server's (500)."""
        if self.speak_after is None or self._samples > 0:  # (a span's units may give no sample)
            return None
        if self._no_room:
            return bad_request(
                f"The conversation leaves no room in the model's context for the spoken answer (at least "
                f"{self.format.min_units + 1} tokens of audio units): shorten the messages.",
                param="messages",
                code="context_length_exceeded",
            )
        return internal_error(
            f"The model's turn ended without the audio units it was asked to speak ({self._request_id})."
        )

    async def _send(self, delta: Delta, units: list[int], *, last: bool) -> None:
        assert self._sink is not None
        samples = await self._sink.decode(units, last=last)
        self._sent += len(units)
        self._last_chunk = len(units)
        self._samples += len(samples)
        AUDIO.add(delta, AudioPiece(samples, self.sample_rate, self._spans, last))


class ModelAudio:
    def __init__(
        self,
        engine: AudioDecoderEngine,
        fmt: AudioSpanFormat,
        store: ArtifactStore,
        *,
        first_chunk_units: int = FIRST_CHUNK_UNITS,
        chunk_units: int = CHUNK_UNITS,
    ) -> None:
        self.engine = engine
        self.format = fmt
        self.store = store  # where spoken answers are kept (store_spoken)
        self.first_chunk_units = first_chunk_units
        self.chunk_units = chunk_units
        self.grammar: CompiledGrammar | None = None  # compiled by prepare()
        # the reference dialect's spoken answer after its call tag (bare units), by prepare()
        self.bare_grammar: CompiledGrammar | None = None

    @classmethod
    def for_model(
        cls, engine: AudioDecoderEngine, tokenizer: TextTokenizer, store: ArtifactStore, **chunking: int
    ) -> ModelAudio:
        fmt = AudioSpanFormat.from_tokenizer(tokenizer)
        if fmt is None:
            raise ValueError(
                "the model has an audio decoder, but its vocabulary lacks the audio span tokens "
                "(<|discrete_audio_start|>, <|discrete_audio_end|>, <|audioNNNN|> units)"
            )
        return cls(engine, fmt, store, **chunking)

    async def prepare(self, compiler: GrammarCompiler) -> None:
        """Compile the span grammar (once, off the event loop)."""
        self.grammar = await self.span_grammar(compiler, self.format.max_units)
        if self.format.call_token_id is not None:
            self.bare_grammar = await compiler.compile(
                GrammarSpec(GrammarKind.GRAMMAR, self.format.bare_grammar(), "audio")
            )

    async def span_grammar(self, compiler: GrammarCompiler, max_units: int) -> CompiledGrammar:
        """The span grammar with at most max_units units (the compiler keeps each it compiled)."""
        fmt = dataclasses.replace(self.format, max_units=max_units)
        return await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, fmt.grammar(), "audio"))

    @property
    def ready(self) -> bool:
        return self.engine.ready

    @property
    def workers(self) -> tuple[SupervisedWorker, ...]:
        return (self.engine,)

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

    def route(
        self, voice: int, *, embedding: bytes | None = None, opened: bool = False, dialect: bool = False,
        voice_named: bool = True, priority: int = 0, live: bool = False,
    ) -> AudioRoute:  # fmt: skip
        """One choice's route: each span it opens gets a vocoder stream in this voice (a row of
        the table, or a speaker embedding taken from a recording). dialect: the reference's
        output, bare units and speaker info, which picks the voice when none is named.
        priority, live: the vocoder's order (AudioDecoderEngine.open_stream)."""
        engine = self.engine
        voices = self.voices

        def speaker_stream(info: Mapping[str, Any]) -> AudioSink | None:
            row = speaker_voice(info, voices)
            return None if row is None else engine.open_stream(row, None, priority=priority, live=live)

        return AudioRoute(
            self.format,
            lambda: engine.open_stream(voice, embedding, priority=priority, live=live),
            self.sample_rate,
            first_chunk_units=self.first_chunk_units,
            chunk_units=self.chunk_units,
            opened=opened,
            bare_units=dialect,
            speaker_stream=speaker_stream if dialect and not voice_named and embedding is None else None,
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


def build(config: ModelConfig, tokenizer: TextTokenizer, store: ArtifactStore, metrics: Metrics) -> ModelAudio | None:
    """A served model's ModelAudio, None when it has no audio decoder."""
    if config.audio_decoder_dir is None:
        return None
    engine = AudioDecoderEngine(
        audio_decoder_worker_spec(config),
        metrics,
        config.name,
        config.audio_decoder,
        start_timeout=config.worker.worker_start_timeout,
    )
    audio = config.audio_decoder
    return ModelAudio.for_model(
        engine, tokenizer, store, first_chunk_units=audio.first_chunk_units, chunk_units=audio.chunk_units
    )


AUDIO: OutputKind[ModelAudio, AudioPiece] = OutputKind(
    "audio", ModelAudio, AudioPiece, AudioRoute, build, START, unasked=False
)
