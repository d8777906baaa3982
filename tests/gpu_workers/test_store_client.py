"""The worker's blocking view of the artifact store, and its byte-bounded LRU."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_workers.store_client import LRUBytes, StoreClient
from omni.shared.store.base import KeyNotFound


def test_put_many_reports_each_item_and_get_reads_back(tmp_path: Path) -> None:
    client = StoreClient(f"local:{tmp_path}")
    try:
        errors = client.put_many([("enc/a/r/1", b"one"), ("../escape", b"x"), ("enc/a/r/2", b"two")])
        assert errors[0] is None and errors[2] is None
        assert isinstance(errors[1], ValueError)  # refused key: only that item fails
        assert client.get("enc/a/r/1") == b"one" and client.get("enc/a/r/2") == b"two"
        with pytest.raises(KeyNotFound):
            client.get("enc/a/r/3")
        assert client.put_many([]) == []
    finally:
        client.close()


def test_lru_evicts_least_recent_by_bytes() -> None:
    lru = LRUBytes(capacity_bytes=10)
    lru.put("a", "A", 4)
    lru.put("b", "B", 4)
    assert lru.get("a") == "A"  # a is now the most recent
    lru.put("c", "C", 4)  # 12 > 10: b, the least recent, goes
    assert (lru.get("a"), lru.get("b"), lru.get("c")) == ("A", None, "C")
    assert lru.size_bytes == 8
    lru.put("huge", "H", 11)  # larger than the cache: not kept, nothing evicted
    assert lru.get("huge") is None and len(lru) == 2
    lru.put("a", "A2", 2)  # replacing re-counts the size
    assert lru.size_bytes == 6 and lru.get("a") == "A2"
