"""The store interface: key segments, the backend registry (a name
per class, imported only when used), the default ranged read, and the store as a context."""

from __future__ import annotations

import pytest

from omni.shared.store.base import (
    ArtifactStore,
    KeyNotFound,
    store_backends,
    store_class,
    validate_key,
    validate_segment,
)


class MemoryStore(ArtifactStore):  # no backend name: not registered
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.calls: list[str] = []

    async def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        self.data[validate_key(key)] = data

    async def get(self, key: str) -> bytes:
        if key not in self.data:
            raise KeyNotFound(f"no artifact {key}")
        return self.data[key]

    async def exists(self, key: str) -> bool:
        return key in self.data

    async def delete(self, key: str) -> None:
        self.data.pop(key, None)

    async def url(self, key: str, expires_s: int) -> str:
        return f"mem://{key}"

    async def start(self) -> None:
        self.calls.append("start")

    async def close(self) -> None:
        self.calls.append("close")


def test_a_segment_is_one_key_segment() -> None:
    # whole keys are tests/omni/shared/store/test_keys.py's
    assert validate_segment("model", "m-1.0") == "m-1.0"
    for bad in ("a/b", ".x", ""):
        with pytest.raises(ValueError, match="invalid model"):
            validate_segment("model", bad)


def test_the_registry_names_each_backend_once() -> None:
    backends = store_backends()
    assert set(backends) >= {"local", "s3"}
    assert store_class("local").backend == "local" and store_class("s3").backend == "s3"
    with pytest.raises(ValueError, match="unknown store backend 'gcs'; known: local, s3"):
        store_class("gcs")
    with pytest.raises(ValueError, match="registered twice"):

        class Again(MemoryStore, backend="local"):
            pass


async def test_the_default_ranged_read_is_a_prefix_and_the_size() -> None:
    store = MemoryStore()
    await store.put("a", b"0123456789")
    assert await store.read_head("a", 4) == (b"0123", 10)
    assert await store.read_head("a", 100) == (b"0123456789", 10)
    with pytest.raises(KeyNotFound) as missing:
        await store.read_head("b", 4)
    assert str(missing.value) == "no artifact b"  # not KeyError's repr
    assert str(KeyNotFound()) == "key not found"


async def test_a_store_starts_and_closes_as_a_context() -> None:
    store = MemoryStore()
    async with store as opened:
        assert opened is store and store.calls == ["start"]
    assert store.calls == ["start", "close"]
