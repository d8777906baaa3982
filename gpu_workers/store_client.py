"""The artifact store as a worker process sees it: blocking get/put over the async store.

Workers run torch in a plain loop, not asyncio, but the store backends are async (the S3 one
holds an aiobotocore client bound to one event loop). So the worker owns one private event
loop on a daemon thread, opens the store there once, and each call waits for its coroutine.
The same ArtifactStore classes the server uses, so both sides agree on keys and layout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import threading
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any, TypeVar

from omni.shared.protocol import StoreSettings
from omni.shared.store.base import ArtifactStore
from omni.shared.store.spec import StoreSpec

T = TypeVar("T")


class StoreClient:
    def __init__(
        self,
        store: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        # Workers never hand out URLs, so the signing secret and URL base are placeholders.
        self._store: ArtifactStore = StoreSpec.parse(store).open(
            url_base="http://worker.invalid",
            secret=secrets.token_bytes(32),
            endpoint_url=endpoint_url,
            region=region,
        )
        self._timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="store-loop", daemon=True)
        self._thread.start()
        self._call(self._store.start())

    @classmethod
    def from_settings(cls, settings: StoreSettings) -> StoreClient:
        return cls(settings.location, endpoint_url=settings.endpoint_url, region=settings.region)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self._timeout_s)

    def get(self, key: str) -> bytes:
        """Raises KeyNotFound or StoreError, as ArtifactStore.get does."""
        return self._call(self._store.get(key))

    def put(self, key: str, data: bytes) -> None:
        self._call(self._store.put(key, data))

    def put_many(self, items: list[tuple[str, bytes]]) -> list[Exception | None]:
        """Publish several artifacts concurrently (one S3 round trip of latency, not one
        per item); each item's exception, or None when it was stored."""

        async def one(key: str, data: bytes) -> Exception | None:
            try:
                await self._store.put(key, data)
            except Exception as e:  # StoreError, or a key the store refuses (ValueError)
                return e
            return None

        async def every() -> list[Exception | None]:
            return list(await asyncio.gather(*(one(k, d) for k, d in items)))

        if not items:
            return []
        try:
            return self._call(every())
        except (TimeoutError, concurrent.futures.TimeoutError) as e:
            return [e] * len(items)

    def close(self) -> None:
        try:
            self._call(self._store.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5.0)


class LRUBytes:
    """Decoded artifacts by key, bounded by their total size in bytes (least recent goes)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._items: OrderedDict[str, tuple[Any, int]] = OrderedDict()

    def get(self, key: str) -> Any | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: str, value: Any, size_bytes: int) -> None:
        if key in self._items:
            self.size_bytes -= self._items.pop(key)[1]
        if size_bytes > self.capacity_bytes:
            return  # larger than the whole cache: serve it once, keep nothing
        self._items[key] = (value, size_bytes)
        self.size_bytes += size_bytes
        while self.size_bytes > self.capacity_bytes:
            _, (_, evicted) = self._items.popitem(last=False)
            self.size_bytes -= evicted

    def __len__(self) -> int:
        return len(self._items)
