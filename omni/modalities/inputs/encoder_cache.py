"""The artifact store as the encoder's cache: what it holds under an encoder key, learned from an
in-memory index first and the store second, so a hit skips the encoder.

A lookup never fails a request: a key that is absent, unreadable or behind a failing store
reads as a miss, and the item is encoded again (the worker then writes it afresh).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from omni.metrics import Metrics
from omni.shared.store.base import ArtifactStore, KeyNotFound, StoreError
from omni.shared.store.codec import EMBEDDINGS, artifact_rows, decode_codes, header_size

log = logging.getLogger("omni.shared.media")

_HEAD_BYTES = 4096  # an encoder artifact's safetensors header is a few hundred bytes

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Encoded:
    num_rows: int
    codes: tuple[int, ...] | None  # discrete components only


class EncoderCache:
    def __init__(self, store: ArtifactStore, metrics: Metrics, *, max_entries: int = 65_536) -> None:
        self.store = store
        self.metrics = metrics
        # What an artifact holds (num_rows, codes) by key: a hit needs no store read at all.
        self._known: OrderedDict[str, Encoded] = OrderedDict()
        self._max_entries = max_entries

    def remember(self, key: str, encoded: Encoded) -> None:
        self._known[key] = encoded
        self._known.move_to_end(key)
        while len(self._known) > self._max_entries:
            self._known.popitem(last=False)

    async def lookup(self, key: str, discrete: bool) -> Encoded | None:
        """What the store holds under key, or None (absent, unreadable: encode again)."""
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
            # Codes live in this process; embeddings must still be in the store for the
            # LLM worker to read (the store may have been swept since).
            if discrete or await self._store_op("exists", self.store.exists(key)):
                return known
            del self._known[key]
            return None
        try:
            encoded = await (self._read_codes(key) if discrete else self._read_rows(key))
        except Exception as e:  # ValueError, or safetensors' own error on a corrupt body
            log.warning("artifact %s is unreadable (%s); encoding again", key, e)
            return None
        if encoded is not None:
            self.remember(key, encoded)
        return encoded

    async def _read_codes(self, key: str) -> Encoded | None:
        # Codes are small and needed here (they become prompt tokens): read them whole.
        data = await self._store_op("get", self.store.get(key))
        if data is None:
            return None
        _tensor, num_rows = artifact_rows(data)
        return Encoded(num_rows, tuple(decode_codes(data)))

    async def _read_rows(self, key: str) -> Encoded | None:
        # Embeddings stay in the store for the LLM worker: the header's shape is all this needs.
        found = await self._store_op("read_head", self.store.read_head(key, _HEAD_BYTES))
        if found is None:
            return None
        head, size = found
        if header_size(head) > len(head):  # an unusually long header: read it all
            found = await self._store_op("read_head", self.store.read_head(key, header_size(head)))
            if found is None:
                return None
            head, size = found
        tensor, num_rows = artifact_rows(head, size)
        if tensor != EMBEDDINGS:
            return None
        return Encoded(num_rows, None)

    async def _store_op(self, operation: str, call: Awaitable[T]) -> T | None:
        """Await a store call; a missing key or a failing store reads as None (a miss)."""
        started = time.perf_counter()
        try:
            result = await call
        except KeyNotFound:
            self.metrics.observe_store(operation, time.perf_counter() - started)
            return None
        except StoreError as e:
            self.metrics.observe_store(operation, time.perf_counter() - started, failed=True)
            log.warning("artifact store %s failed (%s); encoding instead", operation, e)
            return None
        self.metrics.observe_store(operation, time.perf_counter() - started)
        return result
