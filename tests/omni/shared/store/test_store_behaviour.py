"""One behavioural suite for every backend (LocalStore on tmp_path, S3Store on moto)."""

import pytest

from omni.shared.store import ArtifactStore, KeyNotFound, store_backends, store_class
from omni.shared.store.keys import output_key


async def test_put_get_exists_delete(store: ArtifactStore) -> None:
    key = "out/image/abc.png"
    assert not await store.exists(key)
    await store.put(key, b"\x89PNG...", "image/png")
    assert await store.exists(key)
    assert await store.get(key) == b"\x89PNG..."
    await store.delete(key)
    assert not await store.exists(key)
    with pytest.raises(KeyNotFound):
        await store.get(key)


async def test_put_overwrites(store: ArtifactStore) -> None:
    await store.put("a/b", b"one")
    await store.put("a/b", b"two")
    assert await store.get("a/b") == b"two"


async def test_empty_and_binary_values(store: ArtifactStore) -> None:
    await store.put("empty", b"")
    assert await store.get("empty") == b""
    blob = bytes(range(256)) * 4096  # 1 MiB
    await store.put("blob", blob)
    assert await store.get("blob") == blob


async def test_delete_is_idempotent(store: ArtifactStore) -> None:
    await store.delete("never/was")
    await store.put("k", b"x")
    await store.delete("k")
    await store.delete("k")
    assert not await store.exists("k")


async def test_get_missing_raises_key_not_found(store: ArtifactStore) -> None:
    with pytest.raises(KeyNotFound):
        await store.get("missing/key")
    with pytest.raises(KeyError):  # KeyNotFound is a KeyError too
        await store.get("missing/key")


async def test_a_prefix_of_a_key_is_not_a_key(store: ArtifactStore) -> None:
    await store.put("enc/vision/rev/h", b"x")
    assert not await store.exists("enc/vision")
    with pytest.raises(KeyNotFound):
        await store.get("enc/vision")
    await store.delete("enc/vision")  # a "directory", not an artifact: nothing to do
    assert await store.get("enc/vision/rev/h") == b"x"


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a/../b", ".hidden", "a b", "a/", ""])
async def test_invalid_keys_are_rejected_everywhere(store: ArtifactStore, key: str) -> None:
    with pytest.raises(ValueError):
        await store.put(key, b"x")
    with pytest.raises(ValueError):
        await store.get(key)
    with pytest.raises(ValueError):
        await store.exists(key)
    with pytest.raises(ValueError):
        await store.delete(key)
    with pytest.raises(ValueError):
        await store.url(key, 60)


async def test_url_names_the_key(store: ArtifactStore) -> None:
    key = output_key("audio", "wav")
    await store.put(key, b"RIFF", "audio/wav")
    assert key in await store.url(key, 60)


def test_registry_lists_both_backends() -> None:
    assert set(store_backends()) == {"local", "s3"}
    assert store_class("local").backend == "local"
    assert store_class("s3").backend == "s3"
    with pytest.raises(ValueError, match="unknown store backend"):
        store_class("ftp")


@pytest.mark.parametrize("length", [0, 1, 5, 11, 100])
async def test_read_head_returns_a_prefix_and_the_total_size(store: ArtifactStore, length: int) -> None:
    await store.put("enc/x/r/head", b"hello world")
    assert await store.read_head("enc/x/r/head", length) == (b"hello world"[:length], 11)


async def test_read_head_of_missing_and_empty_artifacts(store: ArtifactStore) -> None:
    with pytest.raises(KeyNotFound):
        await store.read_head("enc/x/r/none", 8)
    await store.put("enc/x/r/empty", b"")
    assert await store.read_head("enc/x/r/empty", 8) == (b"", 0)
