"""EncoderCache: an encoder artifact found in the store is a hit (its rows from the header, its
codes read whole), remembered in memory after; anything absent, unreadable or behind a failing
store is a miss, never an error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omni.metrics import Metrics
from omni.modalities.inputs.encoder_cache import Encoded, EncoderCache
from omni.shared.store.base import StoreError
from omni.shared.store.codec import encode_codes, encode_tensors
from omni.shared.store.local import LocalStore


class FailingStore(LocalStore):
    fail = False

    async def get(self, key: str) -> bytes:
        if self.fail:
            raise StoreError("down")
        return await super().get(key)

    async def exists(self, key: str) -> bool:
        if self.fail:
            raise StoreError("down")
        return await super().exists(key)


@pytest.fixture
def store(tmp_path: Path) -> FailingStore:
    return FailingStore(tmp_path, "http://x/files", b"secret")


async def test_embeddings_are_a_hit_from_their_header_and_then_from_memory(store: FailingStore) -> None:
    await store.put("enc/a", encode_tensors({"embeddings": np.zeros((7, 3), dtype=np.float32)}))
    cache = EncoderCache(store, Metrics())
    assert await cache.lookup("enc/a", discrete=False) == Encoded(7, None)
    await store.delete("enc/a")  # swept from the store: memory alone is not a hit for embeddings
    assert await cache.lookup("enc/a", discrete=False) is None
    await store.put("enc/a", encode_tensors({"embeddings": np.zeros((2, 3), dtype=np.float32)}))
    assert await cache.lookup("enc/a", discrete=False) == Encoded(2, None)  # read again, not remembered


async def test_codes_are_read_whole_and_then_known_without_the_store(store: FailingStore) -> None:
    await store.put("enc/c", encode_codes([4, 8, 15, 16]))
    cache = EncoderCache(store, Metrics())
    assert await cache.lookup("enc/c", discrete=True) == Encoded(4, (4, 8, 15, 16))
    store.fail = True  # codes live in this process: no store call needed
    assert await cache.lookup("enc/c", discrete=True) == Encoded(4, (4, 8, 15, 16))


async def test_absent_unreadable_or_unreachable_is_a_miss(store: FailingStore) -> None:
    cache = EncoderCache(store, Metrics())
    assert await cache.lookup("enc/none", discrete=False) is None
    await store.put("enc/junk", b"not safetensors at all")
    assert await cache.lookup("enc/junk", discrete=True) is None
    assert await cache.lookup("enc/junk", discrete=False) is None
    await store.put("enc/codes", encode_codes([1, 2]))
    assert await cache.lookup("enc/codes", discrete=False) is None  # codes where embeddings are wanted
    errors = cache.metrics.registry.get_sample_value
    assert errors("omni_store_errors_total", {"operation": "get"}) is None  # absent is no error
    store.fail = True
    await store.put("enc/x", encode_codes([1]))
    assert await cache.lookup("enc/x", discrete=True) is None
    assert errors("omni_store_errors_total", {"operation": "get"}) == 1.0


async def test_memory_keeps_the_most_recently_used_entries(store: FailingStore) -> None:
    cache = EncoderCache(store, Metrics(), max_entries=2)
    for key in ("enc/a", "enc/b"):
        cache.remember(key, Encoded(1, (1,)))
    assert await cache.lookup("enc/a", discrete=True) == Encoded(1, (1,))  # a is now the newest
    cache.remember("enc/c", Encoded(1, (3,)))  # b, the oldest, leaves
    store.fail = True
    assert await cache.lookup("enc/a", discrete=True) == Encoded(1, (1,))
    assert await cache.lookup("enc/c", discrete=True) == Encoded(1, (3,))
    assert await cache.lookup("enc/b", discrete=True) is None
