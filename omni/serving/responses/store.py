"""Stored responses of POST /v1/responses: what GET, DELETE, cancel and a follow-up's
previous_response_id read back, each kept for a bounded time, and the background runs.

A record lives in process (bounded: ttl_s per record from when it was first stored,
max_entries and max_bytes in all, the oldest going first) and, written through, in the
artifact store under `resp/<id>.json` with its wall-clock expiry inside. The store's copy is
what another process reads: a server restarted, or another node behind the same gateway on a
shared S3 store (docs/SCALE_OUT.md), finds the turn a follow-up names, and drops it when it is
past its time. A record this process drops (expired, pushed out, deleted) is deleted from the
store too; one whose writer died before its time is deleted by the first reader that finds it
expired (on S3, a lifecycle rule on the `resp/` prefix also reclaims any never read again). A
record is the response object as the client sees it and the conversation through it, as chat
messages (an image's bytes are in neither the messages nor, once the response is written,
more than once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson

from omni.shared.store.base import ArtifactStore, KeyNotFound, StoreError, validate_key

log = logging.getLogger(__name__)
RESPONSE_TTL_S = 3600.0  # an hour, as the spoken answers' ids (omni/modalities/outputs/audio.py)
MAX_ENTRIES = 10_000
MAX_BYTES = 512 << 20


@dataclass(slots=True)
class StoredResponse:
    response: dict[str, Any]  # the Response object, as GET returns it
    messages: list[dict[str, Any]]  # the conversation through this response, as chat messages
    expires_at: float  # on the store's clock
    size: int  # bytes of its JSON, counted against max_bytes


class ResponseStore:
    def __init__(
        self,
        *,
        ttl_s: float = RESPONSE_TTL_S,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
        artifacts: ArtifactStore | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.artifacts = artifacts  # None: in process only
        self.wall_clock = wall_clock
        self._writes: set[asyncio.Task[None]] = set()  # store writes and deletes under way
        self._last: dict[str, asyncio.Task[None]] = {}  # the latest of them per key
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.clock = clock
        # Oldest first: every record lives ttl_s from its first put, so this is expiry order too.
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._tasks: dict[str, asyncio.Task[None]] = {}  # background runs, by response id

    def __len__(self) -> int:
        self.sweep()
        return len(self._records)

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def put(self, response_id: str, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        """Store (or overwrite, keeping its expiry) a response; the oldest records go when the
        bounds are passed."""
        self.sweep()
        size = len(orjson.dumps(response)) + len(orjson.dumps(messages))
        old = self._records.get(response_id)
        expires_at = old.expires_at if old is not None else self.clock() + self.ttl_s
        if old is not None:
            self._bytes -= old.size
        self._records[response_id] = StoredResponse(response, messages, expires_at, size)
        self._bytes += size
        if self.artifacts is not None:
            wall_expiry = self.wall_clock() + (expires_at - self.clock())
            record = orjson.dumps({"expires_at": wall_expiry, "response": response, "messages": messages})
            key, artifacts = store_key(response_id), self.artifacts
            self._spawn(key, lambda: artifacts.put(key, record, "application/json"))
        while self._records and (len(self._records) > self.max_entries or self._bytes > self.max_bytes):
            self._drop(next(iter(self._records)))

    def get(self, response_id: str) -> StoredResponse | None:
        """None: never stored, deleted, or past its time (and then freed)."""
        self.sweep()
        return self._records.get(response_id)

    async def fetch(self, response_id: str) -> StoredResponse | None:
        """get(), else the artifact store's copy (another process wrote it); None when neither
        has it, or it is past its time (then the store's copy is deleted)."""
        found = self.get(response_id)
        if found is not None or self.artifacts is None:
            return found
        try:
            key = store_key(response_id)
        except ValueError:  # an id no key could have
            return None
        pending = self._last.get(key)
        if pending is not None:  # this process's own write or delete of it lands first
            await asyncio.gather(pending, return_exceptions=True)
        try:
            raw = await self.artifacts.get(key)
        except KeyNotFound:
            return None
        except StoreError as e:
            log.warning("stored response %s could not be read: %s", response_id, e)
            return None
        try:
            record = orjson.loads(raw)
            left = float(record["expires_at"]) - self.wall_clock()
            response, messages = record["response"], record["messages"]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("stored response %s is not a record; ignored", response_id)
            return None
        if left <= 0:
            self._delete_copy(response_id)
            return None
        return StoredResponse(response, messages, self.clock() + left, len(raw))

    async def remove(self, response_id: str) -> bool:
        """delete(), also of a record only the artifact store holds."""
        if self.delete(response_id):
            return True
        if self.artifacts is None or await self.fetch(response_id) is None:
            return False
        self._delete_copy(response_id)
        return True

    def delete(self, response_id: str) -> bool:
        """Whether this process held such a record; a background run of it is cancelled."""
        self.sweep()
        task = self._tasks.pop(response_id, None)
        if task is not None:
            task.cancel()
        if response_id not in self._records:
            return False
        self._drop(response_id)
        return True

    def sweep(self) -> None:
        now = self.clock()
        while self._records:
            oldest_id, oldest = next(iter(self._records.items()))
            if oldest.expires_at > now:
                break
            self._drop(oldest_id)

    def _drop(self, response_id: str) -> None:
        record = self._records.pop(response_id)
        self._bytes -= record.size
        self._delete_copy(response_id)

    def _delete_copy(self, response_id: str) -> None:
        if self.artifacts is not None:
            key, artifacts = store_key(response_id), self.artifacts
            self._spawn(key, lambda: artifacts.delete(key))

    def _spawn(self, key: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """A store write or delete of key, off the request's path, after the key's earlier ones
        (a delete never overtakes the write it undoes); a failure is logged, not raised (the
        in-process record still serves this process)."""
        before = self._last.get(key)

        async def run() -> None:
            if before is not None:
                await asyncio.gather(before, return_exceptions=True)
            try:
                await work()
            except (StoreError, KeyNotFound) as e:
                log.warning("response store: %s", e)

        task = asyncio.create_task(run())
        self._last[key] = task
        self._writes.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._writes.discard(t)
            if self._last.get(key) is t:
                del self._last[key]

        task.add_done_callback(done)

    # ------------------------------------------------------------------ background runs

    def run_in_background(self, response_id: str, run: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(run, name=f"response {response_id}")
        self._tasks[response_id] = task
        task.add_done_callback(lambda t: self._tasks.pop(response_id, None) if self._tasks.get(response_id) is t else None)

    def cancel(self, response_id: str) -> bool:
        """Cancel a background run; False when none is running (it finished, or never was)."""
        task = self._tasks.pop(response_id, None)
        if task is None:
            return False
        task.cancel()
        return True

    async def close(self) -> None:
        """Cancel every background run and wait for them (the app's cleanup)."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while self._writes:  # let the store catch up
            await asyncio.gather(*list(self._writes), return_exceptions=True)


def store_key(response_id: str) -> str:
    return validate_key(f"resp/{response_id}.json")
