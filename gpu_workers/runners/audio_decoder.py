"""AudioDecoderRunner: the audio decoder's worker kind, a causal unit vocoder over streams.

Each open stream (one span of units the model is writing) keeps its VocoderState here, from
its first chunk to its last; a DecodeAudio batch holds at most one chunk per stream:

    chunks of the batch:    stream 3: units u0..u3 (first)   stream 5: units u40..u64
    rows (right-padded):    [u0 u1 u2 u3 0 ... 0]  len 4      [u40 ... u64]  len 25
    states:                 fresh (zeros)                     the one stream 5 left last time
    one decode_chunk over the rows; each row's next state is cut at its own valid end, so
    batching never changes a stream's samples; row b's audio is its first len * hop samples.

A chunk that cannot be decoded (a unit out of range, a speaker the table lacks, a stream the
worker does not know) fails its stream alone (DecodedAudio.error; the stream is closed); the
others of the batch are decoded. Voices from a reference recording are EmbedSpeaker jobs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from gpu_workers.distributed import GroupMember
from gpu_workers.models.unit_vocoder import LoadedVocoder, VocoderState, load_unit_vocoder
from gpu_workers.runner import Runner, register_runner
from omni.shared import protocol

log = logging.getLogger("omni.audio_decoder")


@dataclass(slots=True)
class _Open:
    state: VocoderState  # batch of one
    speaker: torch.Tensor  # (speaker_embed_dim,)


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

    @classmethod
    def from_spec(cls, spec: protocol.AudioDecoderWorkerSpec, group: GroupMember) -> AudioDecoderRunner:
        return cls(load_unit_vocoder(spec.model_dir, torch.device(spec.device), getattr(torch, spec.dtype)))

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
            self.streams.pop(stream_id, None)
        results: dict[int, protocol.DecodedAudio] = {}
        rows: list[tuple[protocol.AudioChunk, _Open]] = []
        for chunk in job.chunks:
            try:
                rows.append((chunk, self._open(chunk)))
            except ValueError as exc:
                self.streams.pop(chunk.stream_id, None)
                results[chunk.stream_id] = protocol.DecodedAudio(chunk.stream_id, b"", str(exc))
        results.update(self._decode([(c, o) for c, o in rows if c.units]))
        for chunk, opened in rows:
            if not chunk.units:  # nothing to say (a last chunk with no units left)
                results[chunk.stream_id] = protocol.DecodedAudio(chunk.stream_id, b"")
                self.streams[chunk.stream_id] = opened
            if chunk.last:
                self.streams.pop(chunk.stream_id, None)
        ordered = [results[c.stream_id] for c in job.chunks]
        return protocol.AudioDecodeResult(job.batch_id, ordered, time.perf_counter() - started)

    def _open(self, chunk: protocol.AudioChunk) -> _Open:
        """The stream's state and voice: fresh for a first chunk, else the one it left."""
        bad = [u for u in chunk.units if not 0 <= u < self.config.num_units]
        if bad:
            raise ValueError(f"unit {bad[0]} is not in [0, {self.config.num_units})")
        if not chunk.first:
            opened = self.streams.get(chunk.stream_id)
            if opened is None:
                raise ValueError(f"audio stream {chunk.stream_id} is not open here")
            return opened
        if chunk.speaker_embedding is not None:
            vector = np.frombuffer(chunk.speaker_embedding, dtype="<f4")
            if vector.size != self.config.speaker_embed_dim:
                raise ValueError(f"a speaker embedding has {self.config.speaker_embed_dim} values, not {vector.size}")
            speaker = torch.from_numpy(vector.copy()).to(self.device, self.dtype)
        else:
            if not 0 <= chunk.speaker < len(self.loaded.voices):
                raise ValueError(f"speaker {chunk.speaker} is not one of the {len(self.loaded.voices)} voices")
            with torch.inference_mode():
                speaker = self.vocoder.speaker_embedding(torch.tensor([chunk.speaker], device=self.device))[0]
        return _Open(self.vocoder.init_state(1), speaker)

    def _decode(self, rows: list[tuple[protocol.AudioChunk, _Open]]) -> dict[int, protocol.DecodedAudio]:
        if not rows:
            return {}
        longest = max(len(c.units) for c, _ in rows)
        units = torch.zeros(len(rows), longest, dtype=torch.long)
        for i, (chunk, _) in enumerate(rows):
            units[i, : len(chunk.units)] = torch.tensor(chunk.units, dtype=torch.long)
        lengths = torch.tensor([len(c.units) for c, _ in rows], device=self.device)
        state = VocoderState.stack([o.state for _, o in rows])
        speakers = torch.stack([o.speaker for _, o in rows])
        with torch.inference_mode():
            audio, after = self.vocoder.decode_chunk(units.to(self.device), speakers, state, lengths)
        hop = self.config.hop
        out = {}
        samples = audio.float().cpu().numpy()
        for (chunk, opened), row, state_after in zip(rows, samples, after.split(), strict=True):
            self.streams[chunk.stream_id] = _Open(state_after, opened.speaker)
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
