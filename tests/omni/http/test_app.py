"""The app owns the artifact store and serves the local store's signed URLs."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from omni.config import ServerConfig, StoreConfig
from omni.http.app import create_app
from omni.http.state import STORE
from omni.shared.store.local import LocalStore
from omni.shared.store.spec import StoreSpec


@pytest.mark.parametrize(
    "text, spec",
    [
        ("local:/srv/a", StoreSpec("local", "/srv/a")),
        ("s3://bucket/some/prefix/", StoreSpec("s3", "bucket", "some/prefix")),
        ("s3://bucket", StoreSpec("s3", "bucket", "")),
    ],
)
def test_store_spec_parse(text: str, spec: StoreSpec) -> None:
    assert StoreSpec.parse(text) == spec


@pytest.mark.parametrize("text", ["local:", "s3://", "ftp://x", "/just/a/path"])
def test_store_spec_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        StoreSpec.parse(text)


async def test_signed_artifact_urls_are_served_without_the_api_key(tmp_path: Path) -> None:
    config = ServerConfig(store=StoreConfig(f"local:{tmp_path}"), api_key="secret-key")
    app = create_app(config)
    async with TestClient(TestServer(app)) as client:
        store = app[STORE]
        assert isinstance(store, LocalStore)
        await store.put("out/image/abc.png", b"\x89PNG fake")
        url = await store.url("out/image/abc.png", expires_s=60)
        path = url[url.index("/v1/artifacts/") :]
        ok = await client.get(path)
        assert ok.status == 200
        assert await ok.read() == b"\x89PNG fake"
        assert ok.headers["Content-Type"] == "image/png"
        tampered = await client.get(path.replace("sig=", "sig=0"))
        assert tampered.status == 403
        assert (await tampered.json())["error"]["message"]
        # Everything else still needs the key.
        assert (await client.get("/v1/models")).status == 401
        assert (await client.get("/v1/models", headers={"Authorization": "Bearer secret-key"})).status == 200
    assert (tmp_path / "out" / "image" / "abc.png").is_file()
