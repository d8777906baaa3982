"""GET /v1/artifacts/{key}: a local store's signed URL serves its bytes with their type; a
URL without its parameters, with a wrong signature or past its expiry is a 403; a signed key
that is gone a 404; and behind an S3 store the route is not there at all."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.http.app import add_routes
from omni.http.errors import error_middleware
from omni.http.handlers import artifacts as artifacts_module
from omni.http.state import MODELS, STORE
from omni.serving.model import ModelRegistry
from omni.shared.store import local as local_module
from omni.shared.store.base import ArtifactStore
from omni.shared.store.local import LocalStore

# The wall clock URLs are signed, checked and cached by, frozen: expiry and max-age are exact,
# and no test depends on how long it took.
NOW = 1_800_000_000


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SimpleNamespace(time=lambda: float(NOW))
    monkeypatch.setattr(local_module, "time", clock)
    monkeypatch.setattr(artifacts_module, "time", clock)


def app_with(store: ArtifactStore) -> web.Application:
    app = web.Application(middlewares=[error_middleware])
    app[MODELS] = ModelRegistry()
    app[STORE] = store
    add_routes(app)
    return app


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], LocalStore]]:
    store = LocalStore(tmp_path, "", b"secret")
    async with TestClient(TestServer(app_with(store))) as client:
        yield client, store


async def test_a_signed_url_serves_the_bytes_with_their_type(local: tuple[TestClient[Any, Any], LocalStore]) -> None:
    client, store = local
    await store.put("out/images/a.png", b"\x89PNG...")
    r = await client.get(await store.url("out/images/a.png", 600))
    assert r.status == 200 and await r.read() == b"\x89PNG..."
    assert r.headers["Content-Type"] == "image/png" and r.headers["X-Content-Type-Options"] == "nosniff"
    max_age = int(r.headers["Cache-Control"].removeprefix("private, max-age="))
    assert max_age == 600
    await store.put("out/blob", b"x")
    assert (await client.get(await store.url("out/blob", 60))).headers["Content-Type"] == "application/octet-stream"


async def test_a_bad_or_expired_url_is_a_403(local: tuple[TestClient[Any, Any], LocalStore]) -> None:
    client, store = local
    await store.put("out/a.wav", b"RIFF")
    url = await store.url("out/a.wav", 600)
    for bad in (url.split("?")[0], url[:-1] + ("0" if url[-1] != "0" else "1"), url.replace("expires=", "expires=x")):
        r = await client.get(bad)
        assert r.status == 403
        assert (await r.json())["error"]["code"] == "invalid_signature"
    past = NOW - 10
    r = await client.get(f"/v1/artifacts/out/a.wav?expires={past}&sig={store.sign('out/a.wav', past)}")
    assert r.status == 403 and "expired" in (await r.json())["error"]["message"]


async def test_a_signed_key_that_is_gone_is_a_404(local: tuple[TestClient[Any, Any], LocalStore]) -> None:
    client, store = local
    r = await client.get(await store.url("out/never.png", 60))
    assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"


async def test_behind_another_store_the_route_is_a_404(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, "", b"secret")
    await store.put("out/a.png", b"x")

    class Elsewhere(ArtifactStore):  # another backend: its URLs are its own (as S3's presigned ones)
        put, get, exists, delete, url = store.put, store.get, store.exists, store.delete, store.url  # type: ignore[assignment]

    async with TestClient(TestServer(app_with(Elsewhere()))) as client:
        r = await client.get(await store.url("out/a.png", 60))
        assert r.status == 404
