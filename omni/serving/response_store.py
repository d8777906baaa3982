"""Stored responses of POST /v1/responses: what GET, DELETE, cancel and a follow-up's
previous_response_id read back, each kept for a bounded time, and the background runs.

Kept in process, not in the artifact store, on purpose: the store has no listing and no
expiry, so a record written before a restart could never be found again to be freed (it would
leak on disk for good), while in process every record is dropped on time, at the latest when
the process ends. What a follow-up reuses, the llm workers' prefix cache, lives no longer than
the process either. The bounds: ttl_s per record (from when it was first stored), max_entries
and max_bytes in all (the oldest go first). A record is the response object as the client
sees it and the conversation through it, as chat messages (an image's bytes are in neither
the messages nor, once the response is written, more than once).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson

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
    ) -> None:
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
        while self._records and (len(self._records) > self.max_entries or self._bytes > self.max_bytes):
            self._drop(next(iter(self._records)))

    def get(self, response_id: str) -> StoredResponse | None:
        """None: never stored, deleted, or past its time (and then freed)."""
        self.sweep()
        return self._records.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Whether there was such a record; a background run of it is cancelled."""
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
