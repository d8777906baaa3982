"""AudioDecoderRunner: the audio decoder's worker kind, a causal unit vocoder over streams.

Each open stream (one span of units the model is writing) keeps its VocoderState here, from
its first chunk to its last, as one row (its slot) of a batched state per layer (StateSlots);
a DecodeAudio batch holds at most one chunk per stream:

    chunks of the batch:    stream 3: units u0..u3 (first)   stream 5: units u40..u64
    rows (right-padded):    [u0 u1 u2 u3 0 ... 0]  len 4      [u40 ... u64]  len 25
    states:                 fresh (zeros)                     the one stream 5 left last time
                            (slot 2, zeroed)                  (slot 0)
    one decode_chunk over the rows; each row's next state is cut at its own valid end, so
    batching never changes a stream's samples; row b's audio is its first len * hop samples.

A chunk that cannot be decoded (a unit out of range, a speaker the table lacks, a stream the
worker does not know) fails its stream alone (DecodedAudio.error; the stream is closed); the
others of the batch are decoded. Voices from a reference recording are EmbedSpeaker jobs.

The published layout (decoder/audio/ with the reference's .mar archives) runs in
PublishedAudioDecoderRunner: two generators (named voices; zero-shot, whose embeddings come
from its ECAPA-TDNN), non-causal activations, so each stream holds back the samples the next
units can still change (gpu_workers/models/unit_bigvgan.py, UnitStream) and gives them with a
later chunk: a chunk's samples are then not len(units) * hop, but a stream's are, in total,
and they are the one-shot decode's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gpu_workers.distributed import GroupMember
from gpu_workers.models.unit_bigvgan import SAMPLE_RATE, UnitBigVgan, UnitStream, stream_reach
from gpu_workers.models.unit_bigvgan_archive import (
    PublishedAudioDecoder,
    is_published_audio_decoder,
    load_published_audio_decoder,
)
from gpu_workers.models.unit_vocoder import LoadedVocoder, UnitVocoder, VocoderState, load_unit_vocoder
from gpu_workers.runner import Runner, register_runner
from omni.shared import protocol

log = logging.getLogger("omni.audio_decoder")


@dataclass(slots=True)
class _Open:
    slot: int  # its row of the StateSlots
    speaker: torch.Tensor  # (speaker_embed_dim,)


class StateSlots:
    """The VocoderState of every open stream, as one row of a batched state per layer (review
    C7): a batch gathers its streams' rows with one index_select per layer and writes the next
    states back with one index_copy_, where stacking each stream's state and splitting it back
    took a cat per layer and a clone per layer and stream. A new stream's row is zeroed when
    its batch first gathers it (one index_fill_ per layer for all of them); a freed row is
    reused; when every row is taken the rows double."""

    def __init__(self, vocoder: UnitVocoder, capacity: int = 8) -> None:
        self.vocoder = vocoder
        with torch.inference_mode():
            self.state = vocoder.init_state(capacity)  # the model's device and dtype
        self.device = next(iter(self.state.contexts.values())).device
        self._free = list(range(capacity - 1, -1, -1))  # pop() takes the lowest row
        self._fresh: set[int] = set()

    @property
    def capacity(self) -> int:
        return self.state.batch_size

    @property
    def num_taken(self) -> int:
        return self.capacity - len(self._free)

    def take(self) -> int:
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self._fresh.add(slot)
        return slot

    def release(self, slot: int) -> None:
        self._fresh.discard(slot)
        self._free.append(slot)

    def index(self, slots: list[int]) -> torch.Tensor:
        return torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True)

    @torch.inference_mode()
    def gather(self, slots: list[int], index: torch.Tensor) -> VocoderState:
        """The rows `slots` (index: the same on the device), in order, as a batch state."""
        fresh = [s for s in slots if s in self._fresh]
        if fresh:
            zeroed = self.index(fresh)
            for context in self.state.contexts.values():
                context.index_fill_(0, zeroed, 0)
            self._fresh.difference_update(fresh)
        return VocoderState({name: c.index_select(0, index) for name, c in self.state.contexts.items()})

    @torch.inference_mode()
    def scatter(self, index: torch.Tensor, state: VocoderState) -> None:
        for name, context in self.state.contexts.items():
            context.index_copy_(0, index, state.contexts[name])

    @torch.inference_mode()
    def _grow(self) -> None:
        old, capacity = self.state, self.capacity
        dtype = next(iter(old.contexts.values())).dtype  # whatever the model made the rows in
        self.state = self.vocoder.init_state(2 * capacity, device=self.device, dtype=dtype)
        for name, context in self.state.contexts.items():
            context[:capacity] = old.contexts[name]
        self._free = list(range(2 * capacity - 1, capacity - 1, -1))


@register_runner
class AudioDecoderRunner(Runner):
    SPEC = protocol.AudioDecoderWorkerSpec
    JOB = (protocol.DecodeAudio, protocol.EmbedSpeaker)

    def __init__(self, loaded: LoadedVocoder) -> None:
        self.loaded = loaded
        self.vocoder = loaded.vocoder
        self.config = loaded.config
        weight = self.vocoder.speaker_embed.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.streams: dict[int, _Open] = {}
        self.slots = StateSlots(self.vocoder)

    @classmethod
    def from_spec(cls, spec: protocol.AudioDecoderWorkerSpec, group: GroupMember) -> AudioDecoderRunner:
        device, dtype = torch.device(spec.device), getattr(torch, spec.dtype)
        if is_published_audio_decoder(spec.model_dir):
            return PublishedAudioDecoderRunner(load_published_audio_decoder(spec.model_dir, device, dtype))
        return cls(load_unit_vocoder(spec.model_dir, device, dtype))

    def ready_message(self, spec: protocol.AudioDecoderWorkerSpec) -> protocol.AudioDecoderReady:
        c = self.config
        encoder = self.loaded.speaker_encoder
        return protocol.AudioDecoderReady(
            spec.worker_id,
            spec.device,
            c.sample_rate,
            c.hop,
            c.num_units,
            list(self.loaded.voices),
            encoder is not None,
            encoder.config.sample_rate if encoder is not None else 16000,
        )

    def run(self, job: protocol.DecodeAudio | protocol.EmbedSpeaker) -> protocol.AudioDecodeResult | protocol.SpeakerEmbedding:
        if isinstance(job, protocol.EmbedSpeaker):
            return self._embed(job)
        started = time.perf_counter()
        for stream_id in job.closed:
            self._close(stream_id)
        results: dict[int, protocol.DecodedAudio] = {}
        rows: list[tuple[protocol.AudioChunk, _Open]] = []
        for chunk in job.chunks:
            try:
                rows.append((chunk, self._open(chunk)))
            except ValueError as exc:
                self._close(chunk.stream_id)
                results[chunk.stream_id] = protocol.DecodedAudio(chunk.stream_id, b"", str(exc))
        try:
            results.update(self._decode([(c, o) for c, o in rows if self._decodes(c)]))
        except Exception:
            for chunk, _ in rows:  # the streams this batch began are not open after all
                if chunk.first:
                    self._close(chunk.stream_id)
            raise
        for chunk, opened in rows:
            if chunk.stream_id not in results:  # nothing to say (a last chunk with no units left)
                results[chunk.stream_id] = protocol.DecodedAudio(chunk.stream_id, b"")
                self.streams[chunk.stream_id] = opened
            if chunk.last:
                self._close(chunk.stream_id)
        ordered = [results[c.stream_id] for c in job.chunks]
        return protocol.AudioDecodeResult(job.batch_id, ordered, time.perf_counter() - started)

    def _decodes(self, chunk: protocol.AudioChunk) -> bool:
        return bool(chunk.units)

    def _close(self, stream_id: int) -> None:
        opened = self.streams.pop(stream_id, None)
        if opened is not None:
            self.slots.release(opened.slot)

    def _continued(self, chunk: protocol.AudioChunk, num_units: int) -> Any | None:
        """The chunk's units checked; the stream it continues, None for a first chunk."""
        bad = [u for u in chunk.units if not 0 <= u < num_units]
        if bad:
            raise ValueError(f"unit {bad[0]} is not in [0, {num_units})")
        if chunk.first:
            return None
        opened = self.streams.get(chunk.stream_id)
        if opened is None:
            raise ValueError(f"audio stream {chunk.stream_id} is not open here")
        return opened

    def _speaker_vector(self, data: bytes, dim: int) -> torch.Tensor:
        vector = np.frombuffer(data, dtype="<f4")
        if vector.size != dim:
            raise ValueError(f"a speaker embedding has {dim} values, not {vector.size}")
        return torch.from_numpy(vector.copy()).to(self.device, self.dtype)

    def _open(self, chunk: protocol.AudioChunk) -> _Open:
        """The stream's state and voice: fresh for a first chunk, else the one it left."""
        opened = self._continued(chunk, self.config.num_units)
        if opened is not None:
            return opened
        if chunk.speaker_embedding is not None:
            speaker = self._speaker_vector(chunk.speaker_embedding, self.config.speaker_embed_dim)
        else:
            if not 0 <= chunk.speaker < len(self.loaded.voices):
                raise ValueError(f"speaker {chunk.speaker} is not one of the {len(self.loaded.voices)} voices")
            with torch.inference_mode():
                speaker = self.vocoder.speaker_embedding(torch.tensor([chunk.speaker], device=self.device))[0]
        self._close(chunk.stream_id)  # a stream begun again starts from zeros, in a row of its own
        opened = _Open(self.slots.take(), speaker)
        self.streams[chunk.stream_id] = opened  # so that any way it ends frees its row
        return opened

    def _decode(self, rows: list[tuple[protocol.AudioChunk, _Open]]) -> dict[int, protocol.DecodedAudio]:
        if not rows:
            return {}
        longest = max(len(c.units) for c, _ in rows)
        units = torch.zeros(len(rows), longest, dtype=torch.long)
        for i, (chunk, _) in enumerate(rows):
            units[i, : len(chunk.units)] = torch.tensor(chunk.units, dtype=torch.long)
        # units and lengths stay on the host: decode_chunk checks them there, with no sync
        lengths = torch.tensor([len(c.units) for c, _ in rows])
        slots = [o.slot for _, o in rows]
        index = self.slots.index(slots)
        state = self.slots.gather(slots, index)
        speakers = torch.stack([o.speaker for _, o in rows])
        with torch.inference_mode():
            audio, after = self.vocoder.decode_chunk(units, speakers, state, lengths)
        self.slots.scatter(index, after)
        hop = self.config.hop
        out = {}
        samples = audio.float().cpu().numpy()
        for (chunk, opened), row in zip(rows, samples, strict=True):
            self.streams[chunk.stream_id] = opened
            pcm = np.ascontiguousarray(row[: len(chunk.units) * hop], dtype="<f4")
            out[chunk.stream_id] = protocol.DecodedAudio(chunk.stream_id, pcm.tobytes())
        return out

    def _embed(self, job: protocol.EmbedSpeaker) -> protocol.SpeakerEmbedding:
        encoder = self.loaded.speaker_encoder
        if encoder is None:
            return protocol.SpeakerEmbedding(job.job_id, b"", "this audio decoder has no speaker encoder")
        if job.sample_rate != encoder.config.sample_rate:
            return protocol.SpeakerEmbedding(
                job.job_id, b"", f"reference audio must be at {encoder.config.sample_rate} Hz, not {job.sample_rate}"
            )
        wave = torch.from_numpy(np.frombuffer(job.samples, dtype="<f4").copy())
        try:
            with torch.inference_mode():
                vector = encoder.embed(wave)
        except ValueError as exc:
            return protocol.SpeakerEmbedding(job.job_id, b"", str(exc))
        return protocol.SpeakerEmbedding(job.job_id, vector.float().cpu().numpy().astype("<f4").tobytes())


@dataclass(slots=True)
class _OpenSpan:
    stream: UnitStream
    speaker: torch.Tensor  # (spk_emb_dim,)
    generator: UnitBigVgan  # the named voices' or the zero-shot one


class PublishedAudioDecoderRunner(AudioDecoderRunner):
    """The published decoder/audio/: a named voice decodes with the named-voice generator, a
    reference recording's embedding with the zero-shot one. Each stream recomputes a window of
    its units per chunk (UnitStream); rows that are not ending share one batch, right-padded
    (the samples they give do not read past their own units), an ending row runs alone (its
    last samples read the replicate padding at its own end)."""

    def __init__(self, decoder: PublishedAudioDecoder) -> None:  # not super().__init__: that one loads the causal vocoder
        self.decoder = decoder
        self.config_ = decoder.config
        weight = decoder.generators[0].unit_emb.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.reach = {id(g): stream_reach(g.config) for g in decoder.generators}
        self.streams: dict[int, Any] = {}

    def ready_message(self, spec: protocol.AudioDecoderWorkerSpec) -> protocol.AudioDecoderReady:
        zero_shot = self.decoder.zero_shot
        return protocol.AudioDecoderReady(
            spec.worker_id,
            spec.device,
            SAMPLE_RATE,
            self.config_.hop,
            self.config_.num_units,
            list(self.decoder.voices),
            zero_shot is not None,
            zero_shot.sample_rate if zero_shot is not None else SAMPLE_RATE,
        )

    def _decodes(self, chunk: protocol.AudioChunk) -> bool:
        return bool(chunk.units) or chunk.last  # a last chunk gives what was held back

    def _close(self, stream_id: int) -> None:
        self.streams.pop(stream_id, None)  # its UnitStream holds no device state

    def _open(self, chunk: protocol.AudioChunk) -> Any:
        opened = self._continued(chunk, self.config_.num_units)
        if opened is not None:
            return opened
        if chunk.speaker_embedding is not None:
            zero_shot = self.decoder.zero_shot
            if zero_shot is None:
                raise ValueError("this audio decoder has no zero-shot generator: no voices from recordings")
            generator = zero_shot.generator
            speaker = self._speaker_vector(chunk.speaker_embedding, generator.config.spk_emb_dim)
        else:
            voices = self.decoder.voices
            if self.decoder.named is None or not 0 <= chunk.speaker < len(voices):
                raise ValueError(f"speaker {chunk.speaker} is not one of the {len(voices)} voices")
            generator = self.decoder.named.generator
            with torch.inference_mode():
                speaker = generator.voice_embedding(torch.tensor([chunk.speaker], device=self.device))[0]
        return _OpenSpan(UnitStream(self.reach[id(generator)], generator.config.hop), speaker, generator)

    def _decode(self, rows: list[tuple[protocol.AudioChunk, Any]]) -> dict[int, protocol.DecodedAudio]:
        out: dict[int, protocol.DecodedAudio] = {}
        batches: dict[tuple[int, int], list[tuple[int, _OpenSpan, list[int], int, int]]] = {}
        for chunk, opened in rows:
            units, first, end = opened.stream.window(chunk.units, chunk.last)
            if end == first:  # everything held back: nothing to compute yet
                out[chunk.stream_id] = protocol.DecodedAudio(chunk.stream_id, b"")
                self.streams[chunk.stream_id] = opened
                continue
            key = (id(opened.generator), chunk.stream_id if chunk.last else -1)
            batches.setdefault(key, []).append((chunk.stream_id, opened, units, first, end))
        for batch in batches.values():
            generator = batch[0][1].generator
            longest = max(len(units) for _, _, units, _, _ in batch)
            window = torch.zeros(len(batch), longest, dtype=torch.long)
            for i, (_, _, units, _, _) in enumerate(batch):
                window[i, : len(units)] = torch.tensor(units, dtype=torch.long)
            speakers = torch.stack([opened.speaker for _, opened, _, _, _ in batch])
            with torch.inference_mode():
                audio = generator(window.to(self.device), speakers).float().cpu().numpy()
            for row, (stream_id, opened, _, first, end) in zip(audio, batch, strict=True):
                opened.stream.advance(first, end)
                self.streams[stream_id] = opened
                pcm = np.ascontiguousarray(row[first:end], dtype="<f4")
                out[stream_id] = protocol.DecodedAudio(stream_id, pcm.tobytes())
        return out

    def _embed(self, job: protocol.EmbedSpeaker) -> protocol.SpeakerEmbedding:
        zero_shot = self.decoder.zero_shot
        if zero_shot is None:
            return protocol.SpeakerEmbedding(job.job_id, b"", "this audio decoder has no speaker encoder")
        if job.sample_rate != zero_shot.sample_rate:
            return protocol.SpeakerEmbedding(
                job.job_id, b"", f"reference audio must be at {zero_shot.sample_rate} Hz, not {job.sample_rate}"
            )
        from gpu_workers.models.ecapa_tdnn import reference_mel

        wave = np.frombuffer(job.samples, dtype="<f4").copy()
        try:
            mel = torch.as_tensor(reference_mel(wave, job.sample_rate, zero_shot.mel_config))
            with torch.inference_mode():
                vector = zero_shot.encoder(mel.to(self.device, self.dtype))[0]
        except ValueError as exc:
            return protocol.SpeakerEmbedding(job.job_id, b"", str(exc))
        return protocol.SpeakerEmbedding(job.job_id, vector.float().cpu().numpy().astype("<f4").tobytes())
