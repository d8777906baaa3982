import os
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.http.handlers.artifacts import ARTIFACT_ROUTE, serve_artifact
from omni.shared.store import LocalStore, StoreError
from omni.shared.store import local as local_module

# The wall clock the store signs and checks expiry by, frozen: an expiry is then exact, and no
# test depends on how long it took (a URL signed for 60 s stays valid however slow the host).
NOW = 1_800_000_000


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_module, "time", SimpleNamespace(time=lambda: float(NOW)))


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


async def test_files_live_under_root(local_store: LocalStore) -> None:
    await local_store.put("enc/llm/r/h", b"x")
    assert (local_store.root / "enc/llm/r/h").read_bytes() == b"x"
    assert _files(local_store.root) == ["enc/llm/r/h"]


async def test_failed_write_publishes_nothing_and_leaves_no_temp(
    local_store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await local_store.put("out/a.bin", b"old")

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(local_module.os, "fsync", broken_fsync)
    with pytest.raises(StoreError, match="Input/output error"):
        await local_store.put("out/a.bin", b"new, half written")
    with pytest.raises(StoreError):
        await local_store.put("out/b.bin", b"never published")
    assert await local_store.get("out/a.bin") == b"old"  # the old value survives whole
    assert not await local_store.exists("out/b.bin")
    assert _files(local_store.root) == ["out/a.bin"]  # no .tmp- litter


async def test_unwritable_root_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    store = LocalStore(blocker / "root", "http://x", b"s")  # root under a regular file
    with pytest.raises(StoreError):
        await store.put("k", b"x")


def test_needs_a_secret(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LocalStore(tmp_path, "http://x", b"")


def _query(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    q = parse_qs(parts.query)
    return parts.path, int(q["expires"][0]), q["sig"][0]


async def test_signed_url_verifies(local_store: LocalStore) -> None:
    url = await local_store.url("out/image/x.png", 60)
    path, expires, sig = _query(url)
    assert url.startswith("http://testserver/v1/artifacts/out/image/x.png?")
    assert path == "/v1/artifacts/out/image/x.png"
    assert expires == NOW + 60
    assert len(sig) == 64
    assert local_store.verify("out/image/x.png", expires, sig)


async def test_signed_url_rejects_tampering_and_expiry(local_store: LocalStore) -> None:
    _, expires, sig = _query(await local_store.url("out/image/x.png", 60))
    key = "out/image/x.png"
    assert local_store.verify(key, expires, sig, now=expires)  # valid up to expires itself
    assert not local_store.verify(key, expires, sig, now=expires + 1)
    assert not local_store.verify("out/image/y.png", expires, sig)
    assert not local_store.verify(key, expires + 1000, sig)  # extending the expiry
    assert not local_store.verify(key, expires, sig[:-1] + ("0" if sig[-1] != "0" else "1"))
    assert not local_store.verify(key, expires, "")
    assert not local_store.verify(key, expires, "é" * 64)  # non-ASCII: False, not an error
    other = LocalStore(local_store.root, "http://testserver", b"another-secret")
    assert not other.verify(key, expires, sig)


@pytest.fixture
async def client(local_store: LocalStore):  # type: ignore[no-untyped-def]
    async def get(request: web.Request) -> web.StreamResponse:
        return await serve_artifact(local_store, request)

    app = web.Application()
    app.router.add_get(ARTIFACT_ROUTE, get)
    async with TestClient(TestServer(app)) as c:
        yield c


def _relative(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


async def _error(resp) -> dict:  # type: ignore[no-untyped-def]
    body = orjson.loads(await resp.read())
    assert set(body["error"]) - {"request_id"} == {"message", "type", "param", "code"}
    return body["error"]


async def test_route_serves_signed_artifact(local_store: LocalStore, client: TestClient) -> None:
    await local_store.put("out/image/x.png", b"\x89PNG data")
    resp = await client.get(_relative(await local_store.url("out/image/x.png", 60)))
    assert resp.status == 200
    assert resp.content_type == "image/png"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert await resp.read() == b"\x89PNG data"

    await local_store.put("out/audio/y.wav", b"RIFF")
    resp = await client.get(_relative(await local_store.url("out/audio/y.wav", 60)))
    assert resp.status == 200
    assert resp.content_type in {"audio/x-wav", "audio/wav"}

    await local_store.put("enc/c/r/h", b"raw")
    resp = await client.get(_relative(await local_store.url("enc/c/r/h", 60)))
    assert resp.content_type == "application/octet-stream"


async def test_route_forbids_bad_signatures(local_store: LocalStore, client: TestClient) -> None:
    await local_store.put("out/image/x.png", b"data")
    _, expires, sig = _query(await local_store.url("out/image/x.png", 60))
    base = "/v1/artifacts/out/image/x.png"
    for query in [
        "",
        f"?expires={expires}",
        f"?sig={sig}",
        f"?expires=soon&sig={sig}",
        f"?expires={expires}&sig={'0' * 64}",
        f"?expires={expires + 1}&sig={sig}",
        f"?expires={expires}&sig=%C3%A9",
    ]:
        resp = await client.get(base + query)
        assert resp.status == 403, query
        err = await _error(resp)
        assert err["type"] == "invalid_request_error"
        assert err["code"] == "invalid_signature"
    # A signature for one key does not open another.
    await local_store.put("out/image/z.png", b"secret")
    resp = await client.get(f"/v1/artifacts/out/image/z.png?expires={expires}&sig={sig}")
    assert resp.status == 403


async def test_route_forbids_expired_url(local_store: LocalStore, client: TestClient) -> None:
    await local_store.put("out/image/x.png", b"data")
    expires = NOW - 1
    sig = local_store.sign("out/image/x.png", expires)
    resp = await client.get(f"/v1/artifacts/out/image/x.png?expires={expires}&sig={sig}")
    assert resp.status == 403
    assert "expired" in (await _error(resp))["message"]


async def test_route_404_when_missing(local_store: LocalStore, client: TestClient) -> None:
    resp = await client.get(_relative(await local_store.url("out/image/gone.png", 60)))
    assert resp.status == 404
    assert (await _error(resp))["code"] == "not_found"


async def test_route_never_escapes_root(
    local_store: LocalStore, client: TestClient, tmp_path: Path
) -> None:
    (tmp_path / "outside").write_bytes(b"private")
    key = "../outside"
    expires = NOW + 60
    sig = local_store.sign(key, expires)  # even a correctly signed traversal is refused
    resp = await client.get(f"/v1/artifacts/{key}?expires={expires}&sig={sig}")
    assert resp.status in (403, 404)
    assert b"private" not in await resp.read()
    assert os.path.exists(tmp_path / "outside")
