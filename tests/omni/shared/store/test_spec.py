"""StoreSpec: the --store flag's values, and the store each opens."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni.shared.store.local import LocalStore
from omni.shared.store.spec import StoreSpec, default_store_dir


def test_the_default_is_a_local_store_under_the_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OMNI_SERVE_CACHE", str(tmp_path))
    assert default_store_dir() == tmp_path / "artifacts"
    assert StoreSpec.parse("") == StoreSpec("local", str(tmp_path / "artifacts"))
    monkeypatch.delenv("OMNI_SERVE_CACHE")
    assert default_store_dir() == Path.home() / ".cache" / "omni-serve" / "artifacts"


def test_local_and_s3_values_parse() -> None:
    assert StoreSpec.parse("local:/var/lib/omni") == StoreSpec("local", "/var/lib/omni")
    assert StoreSpec.parse("local:~/omni") == StoreSpec("local", str(Path.home() / "omni"))
    assert StoreSpec.parse("s3://bucket/a/b/") == StoreSpec("s3", "bucket", "a/b")
    assert StoreSpec.parse("s3://bucket") == StoreSpec("s3", "bucket", "")


@pytest.mark.parametrize(
    ("text", "message"),
    [("local:", "needs a directory"), ("s3:///x", "no bucket"), ("gs://b", "use local:DIR or s3://BUCKET/PREFIX")],
)
def test_bad_values_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StoreSpec.parse(text)


async def test_a_local_spec_opens_a_local_store_there(tmp_path: Path) -> None:
    store = StoreSpec("local", str(tmp_path)).open(url_base="http://h/files/", secret=b"s")
    assert isinstance(store, LocalStore) and store.root == tmp_path and store.url_base == "http://h/files"
    await store.put("out/x.bin", b"abc")
    assert (tmp_path / "out" / "x.bin").read_bytes() == b"abc"
    # without a secret each opening gets its own random one: their URLs differ
    a = StoreSpec("local", str(tmp_path)).open(url_base="http://h")
    b = StoreSpec("local", str(tmp_path)).open(url_base="http://h")
    assert await a.url("out/x.bin", 60) != await b.url("out/x.bin", 60)
