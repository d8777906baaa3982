"""AudioDecoderEngine: the vocoder's worker and the batching of audio streams.

An audio stream is one span of units the model is writing; the output router feeds it in
chunks as the units are sampled (a small first chunk, so sound starts early, larger ones
after) and gets each chunk's samples back. The vocoder is causal and keeps each open stream's
state in the worker, so a stream's chunks decode in order, and decoding in chunks gives the
samples of decoding the whole span at once.

    router:  stream = engine.open_stream(voice)      (nothing sent yet)
             await stream.decode(units[0:4])          first=True: a fresh state in the worker
             await stream.decode(units[4:29])
             await stream.decode(units[29:], last=True)   the worker frees the state
    engine:  each batch takes the oldest waiting chunk of every stream that has one (at most
             one per stream: the next waits for it), up to max_batch_streams streams: the most
             urgent first (their requests' priority), a live session's before other speech

Concurrent requests share every vocoder forward. A stream abandoned mid-span (its client
left) is closed in the worker with the next batch. The streams whose state was in a worker
that died fail (an EngineError: a 503 or an error event); a stream not yet opened goes on
with the restarted worker. Voices from a reference recording (the speaker encoder) are
EmbedSpeaker jobs, run between batches.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass

from omni.config import AudioDecoderConfig
from omni.engines.admission import Limit, Overloaded
from omni.engines.supervisor import EngineError, SupervisedWorker, fail_futures
from omni.engines.worker_process import WorkerDied
from omni.metrics import Metrics
from omni.shared import protocol

log = logging.getLogger("omni.engines.audio_decoder")

RETRY_AFTER_S = 2


class AudioDecodeError(EngineError):
    """The vocoder refused a stream (a unit out of range, an unknown speaker). The span grammar
    and the voice table keep requests from getting here; one that does fails as a 503."""


@dataclass(slots=True)
class _Chunk:
    chunk: protocol.AudioChunk
    future: asyncio.Future[bytes]


@dataclass(slots=True)
class _Embed:
    job: protocol.EmbedSpeaker
    future: asyncio.Future[bytes]


class AudioStream:
    """One span's audio: its chunks in order, through the engine's batches."""

    def __init__(
        self,
        engine: AudioDecoderEngine,
        stream_id: int,
        speaker: int,
        embedding: bytes | None,
        *,
        priority: int = 0,
        live: bool = False,
    ) -> None:
        self._engine = engine
        self.stream_id = stream_id
        # the batch order: its request's priority (lower first), then a live session's before
        # other speech, then the oldest
        self.order = (priority, not live, stream_id)
        self._speaker = speaker
        self._embedding = embedding
        self.opened = False  # its first chunk has been sent: its state is in the worker
        self.finished = False  # its last chunk has been sent, or it was closed
        self.error: EngineError | None = None  # set when its state died with a worker
        self.queue: list[_Chunk] = []
        self.inflight: _Chunk | None = None

    async def decode(self, units: list[int], *, last: bool = False) -> bytes:
        """The samples (float32 bytes, len(units) * hop of them) of the stream's next units."""
        if self.error is not None:
            raise self.error
        if self.finished:
            raise RuntimeError(f"audio stream {self.stream_id} is finished")
        first = not self.opened and not self.queue and self.inflight is None
        chunk = protocol.AudioChunk(
            self.stream_id,
            list(units),
            speaker=self._speaker if first else 0,
            speaker_embedding=self._embedding if first else None,
            first=first,
            last=last,
        )
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.queue.append(_Chunk(chunk, future))
        self.finished = last
        self._engine.wake()
        try:
            return await future
        except asyncio.CancelledError:
            self.close()  # the caller left mid-stream: the worker frees its state
            raise

    def close(self) -> None:
        """Give the stream up (a client that left): its queued chunks are dropped, and its state
        in the worker is freed with the next batch."""
        if self.finished and not self.queue and self.inflight is None:
            self._engine.forget(self)
            return
        self.finished = True
        fail_futures((c.future for c in self.queue), asyncio.CancelledError())
        self.queue.clear()
        self._engine.close_stream(self)


class AudioDecoderEngine(SupervisedWorker):
    def __init__(
        self,
        spec: protocol.AudioDecoderWorkerSpec,
        metrics: Metrics,
        model_name: str,
        config: AudioDecoderConfig | None = None,
        *,
        start_timeout: float = 600.0,
    ) -> None:
        super().__init__(spec, name=f"{model_name} audio decoder", start_timeout=start_timeout)
        config = config or AudioDecoderConfig()
        self.metrics = metrics
        self.model_name = model_name
        self.max_batch_streams = config.max_batch_streams
        self.max_open_streams = config.max_open_streams
        self.info: protocol.AudioDecoderReady | None = None
        self._streams: dict[int, AudioStream] = {}
        self._closed: list[int] = []  # opened streams given up on, to close in the worker
        self._embeds: list[_Embed] = []
        self._inflight_embed: _Embed | None = None
        self._ids = itertools.count(1)
        self._batch_id = 0
        self.last_batch: tuple[int, float] = (0, 0.0)  # (streams, seconds) of the latest batch

    def on_ready(self, ready: protocol.AudioDecoderReady) -> None:
        self.info = ready
        log.info(
            "%s: ready on %s: %d units, %d Hz, %d voices%s",
            self.name, ready.device, ready.num_units, ready.sample_rate, len(ready.speakers),
            ", voices from recordings" if ready.speaker_encoder else "",
        )  # fmt: skip

    @property
    def num_open_streams(self) -> int:
        return len(self._streams)

    def check_room(self) -> None:
        """Before a request that asked for audio starts: refuse it (429) when the vocoder has
        as many open streams as it may. A span the model opens on its own is never refused."""
        if len(self._streams) < self.max_open_streams:
            return
        raise Overloaded(
            self.model_name,
            Limit.AUDIO,
            f"The audio decoder is speaking {len(self._streams)} answers at once, its most. "
            f"Please try again in {RETRY_AFTER_S} s.",
            RETRY_AFTER_S,
        )

    def open_stream(
        self, speaker: int = 0, embedding: bytes | None = None, *, priority: int = 0, live: bool = False
    ) -> AudioStream:
        """priority: its request's (lower first); live: a realtime session's, which a listener
        hears as it is made (served before other speech of its priority)."""
        if not self.ready:
            raise EngineError("the audio decoder is not ready")
        stream = AudioStream(self, next(self._ids), speaker, embedding, priority=priority, live=live)
        self._streams[stream.stream_id] = stream
        self.metrics.set_audio_streams(self.model_name, len(self._streams))
        return stream

    async def embed_speaker(self, samples: bytes, sample_rate: int) -> bytes:
        """A voice from a reference recording: its float32 speaker embedding."""
        if self.info is None or not self.info.speaker_encoder:
            raise EngineError("this model's audio decoder has no speaker encoder")
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._embeds.append(_Embed(protocol.EmbedSpeaker(next(self._ids), samples, sample_rate), future))
        self.wake()
        return await future

    def close_stream(self, stream: AudioStream) -> None:
        if stream.opened and stream.inflight is None:
            self._closed.append(stream.stream_id)
        if stream.inflight is None:
            self._streams.pop(stream.stream_id, None)
        self.wake()

    def forget(self, stream: AudioStream) -> None:
        self._streams.pop(stream.stream_id, None)

    # ---- the job loop ----------------------------------------------------------------
    def _next_batch(self) -> list[tuple[AudioStream, _Chunk]]:
        """The oldest waiting chunk of each stream with one, in the streams' order (AudioStream.order:
        most urgent, live sessions, oldest first)."""
        batch = []
        for stream in sorted(self._streams.values(), key=lambda s: s.order):
            if stream.inflight is None and stream.queue and stream.error is None:
                batch.append((stream, stream.queue.pop(0)))
                if len(batch) == self.max_batch_streams:
                    break
        return batch

    async def run_once(self) -> None:
        if self._embeds:
            await self._embed(self._embeds.pop(0))
            return
        batch = self._next_batch()
        if not batch and not self._closed:
            await self.wait_for_work()
            return
        for stream, chunk in batch:
            stream.inflight = chunk
            stream.opened = True
        closed, self._closed = self._closed, []
        try:
            await self._execute(batch, closed)
        except WorkerDied:
            # fail_on_worker fails the streams whose state died, the chunks in flight with
            # them; the supervisor restarts the worker
            raise
        except Exception as exc:  # a bug costs this batch's streams, not the server
            log.exception("%s: audio batch failed", self.name)
            for stream, _ in batch:
                self._break(stream, EngineError(f"internal error in the audio decoder: {exc}"))
        for stream, _ in batch:
            stream.inflight = None
            if stream.finished and not stream.queue:
                self._streams.pop(stream.stream_id, None)
        self.metrics.set_audio_streams(self.model_name, len(self._streams))

    async def _execute(self, batch: list[tuple[AudioStream, _Chunk]], closed: list[int]) -> None:
        self._batch_id += 1
        sent = time.monotonic()
        await self.worker.send(protocol.DecodeAudio(self._batch_id, [c.chunk for _, c in batch], closed))
        reply = await self.worker.recv()
        if isinstance(reply, protocol.WorkerError):
            for stream, _ in batch:
                self._break(stream, EngineError(f"audio decoder error: {reply.message}"))
            return
        if not isinstance(reply, protocol.AudioDecodeResult) or reply.batch_id != self._batch_id:
            raise WorkerDied(f"audio decoder replied out of order: {type(reply).__name__}")
        self.last_batch = (len(batch), time.monotonic() - sent)
        results = {r.stream_id: r for r in reply.chunks}
        made = sum(len(r.samples) for r in reply.chunks) // 4  # float32 samples
        rate = self.info.sample_rate if self.info is not None else 24000
        self.metrics.observe_audio_batch(self.model_name, len(batch), self.last_batch[1], made / rate)
        failed = sum(1 for r in reply.chunks if r.error is not None) + len(batch) - len(results)
        self.metrics.add_audio_chunks(self.model_name, "ok", len(batch) - failed)
        self.metrics.add_audio_chunks(self.model_name, "error", failed)
        for stream, chunk in batch:
            result = results.get(stream.stream_id)
            if result is None or result.error is not None:
                why = "the audio decoder returned nothing" if result is None else result.error
                self._break(stream, AudioDecodeError(f"audio stream {stream.stream_id}: {why}"))
            elif not chunk.future.done():
                chunk.future.set_result(result.samples)

    async def _embed(self, pending: _Embed) -> None:
        self._inflight_embed = pending
        try:
            await self.worker.send(pending.job)
            reply = await self.worker.recv()
        finally:
            self._inflight_embed = None
        if isinstance(reply, protocol.WorkerError):
            fail_futures([pending.future], EngineError(f"speaker encoder error: {reply.message}"))
        elif not isinstance(reply, protocol.SpeakerEmbedding) or reply.job_id != pending.job.job_id:
            raise WorkerDied(f"audio decoder replied out of order: {type(reply).__name__}")
        elif reply.error is not None:
            fail_futures([pending.future], AudioDecodeError(reply.error))
        elif not pending.future.done():
            pending.future.set_result(reply.embedding)

    def _break(self, stream: AudioStream, error: EngineError) -> None:
        """The stream cannot go on: its state is gone or refused. Its waiters fail, and so
        does any later chunk it is given."""
        stream.error = error
        stream.finished = True
        fail_futures([c.future for c in stream.queue] + ([stream.inflight.future] if stream.inflight else []), error)
        stream.queue.clear()
        self._streams.pop(stream.stream_id, None)

    def fail_on_worker(self, error: EngineError) -> None:
        """Every opened stream's state died with the worker; a stream not yet opened goes on."""
        opened = [s for s in self._streams.values() if s.opened]
        self.metrics.add_audio_chunks(self.model_name, "failed", sum(s.inflight is not None for s in opened))
        for stream in opened:
            self._break(stream, error)
        self._closed.clear()
        if self._inflight_embed is not None:
            fail_futures([self._inflight_embed.future], error)

    def fail_pending(self, error: EngineError) -> None:
        for stream in list(self._streams.values()):
            self._break(stream, error)
        fail_futures((e.future for e in self._embeds), error)
        self._embeds.clear()
        self.fail_on_worker(error)
