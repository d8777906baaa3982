"""EncoderEngine: one encoder worker process and continuous batching of media items.

Requests submit items (one per media item and component) and await the result. While a
batch runs in the worker, newly submitted items queue; the next batch takes all of them (up
to max_batch_items), so concurrent requests share forwards without any waiting window. Two
requests submitting the same key share one encode. Items wait in (priority, arrival) order, so
under --scheduling-policy priority a voice turn's audio is encoded before a batch job's.

The queue is bounded in items and in their bytes, as the LLM's is in requests and tokens
(omni/engines/admission.py): an item beyond either bound is refused at once with Overloaded (a 429),
unless the queue is empty. An item joining the encode of its key already queued is free.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import logging
import time
from dataclasses import dataclass

from omni.config import EncoderConfig
from omni.engines.admission import Limit, Overloaded
from omni.engines.supervisor import EngineError, SupervisedWorker, fail_futures
from omni.engines.worker_process import WorkerDied
from omni.metrics import Metrics
from omni.shared import protocol

log = logging.getLogger("omni.engines.encoder")

# Default queue bounds: this many batches of items, and this many of the largest items'
# bytes (the per-item limit): a little over a second of a busy encoder's work, not minutes.
QUEUED_BATCHES = 4
QUEUED_LARGEST_ITEMS = 8
# An encode takes one batch's time: long enough to wait before retrying.
RETRY_AFTER_S = 1


@dataclass(slots=True, eq=False)  # compared by identity (the queue's `in` and remove)
class _Pending:
    item: protocol.EncodeItem
    future: asyncio.Future[protocol.EncodedItem]
    priority: int = 0  # its most urgent asker's (--scheduling-policy priority; lower first)

    @property
    def order(self) -> tuple[int, int]:
        return self.priority, self.item.item_id


class EncoderEngine(SupervisedWorker):
    def __init__(
        self,
        spec: protocol.EncoderWorkerSpec,
        metrics: Metrics,
        model_name: str,
        config: EncoderConfig | None = None,
        *,
        start_timeout: float = 600.0,
    ) -> None:
        super().__init__(spec, name=f"{model_name} encoder worker", start_timeout=start_timeout)
        config = config or EncoderConfig()
        self.metrics = metrics
        self.model_name = model_name
        self.max_batch_items = config.max_batch_items
        max_queued_items, max_queued_bytes = config.max_queued_items, config.max_queued_bytes
        if max_queued_items is None:
            max_queued_items = QUEUED_BATCHES * self.max_batch_items
        if max_queued_bytes is None:
            max_queued_bytes = QUEUED_LARGEST_ITEMS * spec.media_limits.max_bytes
        self.max_queued_items = max_queued_items
        self.max_queued_bytes = max_queued_bytes
        self._queued_bytes = 0  # of the items in _queue
        self.components: frozenset[str] = frozenset()
        self._queue: list[_Pending] = []
        self._inflight: list[_Pending] = []  # the batch the worker is running
        self._by_key: dict[str, _Pending] = {}
        self._next_id = 0
        self._batch_id = 0

    def on_ready(self, ready: protocol.EncoderReady) -> None:
        self.components = frozenset(ready.components)
        log.info("%s: ready on %s: %s", self.name, ready.device, ", ".join(ready.components))

    async def encode(
        self, component: str, kind: str, key: str, data: bytes, fmt: str | None, param: str, *, priority: int = 0
    ) -> protocol.EncodedItem:
        """Encode one item (or join the encode of the same key already under way). Items wait
        in (priority, arrival) order, lower first: under fcfs every priority is 0."""
        if not self.ready:
            raise EngineError("the encoder worker is not ready")
        pending = self._by_key.get(key)
        if pending is None:
            self._check_room(len(data))
            future: asyncio.Future[protocol.EncodedItem] = asyncio.get_running_loop().create_future()
            self._next_id += 1
            item = protocol.EncodeItem(self._next_id, component, kind, key, data, fmt, param)
            pending = _Pending(item, future, priority)
            bisect.insort_right(self._queue, pending, key=lambda p: p.order)
            self._queued_bytes += len(data)
            self._by_key[key] = pending
            future.add_done_callback(functools.partial(self._forget_key, key))
            self.wake()
        elif priority < pending.priority and pending in self._queue:  # a more urgent asker joins
            self._queue.remove(pending)
            pending.priority = priority
            bisect.insort_right(self._queue, pending, key=lambda p: p.order)
        # shield: one waiter giving up (client gone) must not cancel the others' result
        return await asyncio.shield(pending.future)

    def _check_room(self, num_bytes: int) -> None:
        if not self._queue:
            return
        if len(self._queue) + 1 > self.max_queued_items:
            limit = Limit.MEDIA_ITEMS
            what = f"{len(self._queue)} media items are waiting, and at most {self.max_queued_items} may"
        elif self._queued_bytes + num_bytes > self.max_queued_bytes:
            limit = Limit.MEDIA_BYTES
            what = (
                f"{self._queued_bytes} bytes of media are waiting; {num_bytes} more would pass "
                f"{self.max_queued_bytes}"
            )
        else:
            return
        self.metrics.add_rejected(self.model_name, limit.value)
        raise Overloaded(
            self.model_name,
            limit,
            f"The encoder's queue is full: {what}. Please try again in {RETRY_AFTER_S} s.",
            RETRY_AFTER_S,
        )

    def _forget_key(self, key: str, _future: object) -> None:
        self._by_key.pop(key, None)

    async def run_once(self) -> None:
        if not self._queue:
            await self.wait_for_work()
            return
        batch, self._queue = self._queue[: self.max_batch_items], self._queue[self.max_batch_items :]
        self._queued_bytes -= sum(len(p.item.data) for p in batch)
        self._inflight = batch
        try:
            await self._execute(batch)
        except WorkerDied:
            raise  # the supervisor fails the batch in flight (fail_on_worker) and restarts
        except Exception as exc:  # a bug costs this batch, not the server
            log.exception("%s: encode batch failed", self.name)
            self._fail(batch, EngineError(f"internal error: {exc}"))
        # Not reached when cancelled (stop) or when the worker died: fail_pending and
        # fail_on_worker then still see the batch in flight.
        self._inflight = []

    async def _execute(self, batch: list[_Pending]) -> None:
        self._batch_id += 1
        sent = time.monotonic()
        await self.worker.send(protocol.EncodeBatch(self._batch_id, [p.item for p in batch]))
        reply = await self.worker.recv()
        if isinstance(reply, protocol.WorkerError):
            self._fail(batch, EngineError(f"encoder error: {reply.message}"))
            return
        if not isinstance(reply, protocol.EncodeResult) or reply.batch_id != self._batch_id:
            raise WorkerDied(f"encoder worker replied out of order: {type(reply).__name__}")
        self.metrics.observe_encoder_batch(self.model_name, time.monotonic() - sent, reply.forwards)
        if any(r.error is None for r in reply.items):  # something was encoded, so written
            self.metrics.observe_store("put", reply.store_put_seconds)
        self.metrics.add_store_errors("put", reply.store_put_failures)
        by_id = {r.item_id: r for r in reply.items}
        for pending in batch:
            result = by_id.get(pending.item.item_id)
            if pending.future.done():
                continue
            if result is None:
                pending.future.set_exception(EngineError("the encoder returned no result"))
            else:
                pending.future.set_result(result)

    def fail_on_worker(self, error: EngineError) -> None:
        """Only the batch in flight died with the worker; queued items wait for the new one."""
        self._fail(self._inflight, error)
        self._inflight = []

    def fail_pending(self, error: EngineError) -> None:
        self._fail(self._inflight + self._queue, error)
        self._inflight, self._queue = [], []
        self._queued_bytes = 0

    @staticmethod
    def _fail(batch: list[_Pending], error: Exception) -> None:
        fail_futures((pending.future for pending in batch), error)
