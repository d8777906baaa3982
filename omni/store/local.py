"""LocalStore: artifacts as files under a directory, served by omni-serve at signed URLs."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import mimetypes
import os
import tempfile
import time
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler

from omni.api.errors import APIError, not_found
from omni.store.base import ArtifactStore, KeyNotFound, StoreError, validate_key

ARTIFACT_ROUTE = "/v1/artifacts/{key:.+}"
_TMP_PREFIX = ".tmp-"  # keys cannot start a segment with ".", so temp names never clash


class LocalStore(ArtifactStore, backend="local"):
    """Files under root. content_type is not stored: the route guesses it from the extension."""

    def __init__(self, root: Path, url_base: str, secret: bytes) -> None:
        if not secret:
            raise ValueError("LocalStore needs a non-empty secret to sign URLs")
        self.root = Path(root)
        self.url_base = url_base.rstrip("/")
        self._secret = secret

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    async def put(
        self, key: str, data: bytes, content_type: str = "application/octet-stream"
    ) -> None:
        path = self._path(key)
        try:
            await asyncio.to_thread(self._write_then_publish, path, data)
        except OSError as e:
            raise StoreError(f"local store: cannot write {key}: {e.strerror or e}") from e

    @staticmethod
    def _write_then_publish(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write a temp file in the same directory (same filesystem), then rename it over the
        # key: os.replace is atomic, so a reader never sees a half-written artifact.
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # so a crash cannot publish an empty file
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise KeyNotFound(key) from None
        except OSError as e:
            raise StoreError(f"local store: cannot read {key}: {e.strerror or e}") from e

    async def read_head(self, key: str, length: int) -> tuple[bytes, int]:
        path = self._path(key)

        def read() -> tuple[bytes, int]:
            with path.open("rb") as f:
                return f.read(length), os.fstat(f.fileno()).st_size

        try:
            return await asyncio.to_thread(read)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise KeyNotFound(key) from None
        except OSError as e:
            raise StoreError(f"local store: cannot read {key}: {e.strerror or e}") from e

    async def exists(self, key: str) -> bool:
        path = self._path(key)
        return await asyncio.to_thread(path.is_file)

    async def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            await asyncio.to_thread(path.unlink, missing_ok=True)
        except (IsADirectoryError, NotADirectoryError):
            return  # no artifact has that key
        except OSError as e:
            raise StoreError(f"local store: cannot delete {key}: {e.strerror or e}") from e

    async def url(self, key: str, expires_s: int) -> str:
        validate_key(key)
        expires = int(time.time()) + expires_s
        # The key charset is URL-safe, so it needs no quoting.
        return f"{self.url_base}/v1/artifacts/{key}?expires={expires}&sig={self.sign(key, expires)}"

    def sign(self, key: str, expires: int) -> str:
        # "\n" separates the fields: a key never contains one, so ("a1", 23) != ("a", 123).
        message = f"{key}\n{expires}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def verify(self, key: str, expires: int, sig: str, now: float | None = None) -> bool:
        if (time.time() if now is None else now) > expires:
            return False
        # Bytes, not str: compare_digest raises on non-ASCII str, and sig comes from a client.
        expected = self.sign(key, expires).encode()
        return hmac.compare_digest(expected, sig.encode("utf-8", "replace"))


def _forbidden(message: str) -> web.Response:
    return APIError(403, message, code="invalid_signature").to_response()


def artifact_route(store: LocalStore) -> Handler:
    """The GET handler for ARTIFACT_ROUTE: checks the signed URL, then serves the bytes."""

    async def get_artifact(request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        try:
            expires = int(request.query["expires"])
            sig = request.query["sig"]
        except (KeyError, ValueError):
            return _forbidden("Artifact URL is missing a valid `expires` or `sig` parameter.")
        if not store.verify(key, expires, sig):
            return _forbidden("Artifact URL signature is invalid or has expired.")
        try:
            data = await store.get(key)
        except (KeyNotFound, ValueError):
            return not_found(f"Artifact `{key}` does not exist.", code="not_found").to_response()
        except StoreError:
            return APIError(500, "The artifact could not be read.").to_response()
        content_type = mimetypes.guess_type(key)[0] or "application/octet-stream"
        max_age = max(0, expires - int(time.time()))
        return web.Response(
            body=data,
            content_type=content_type,
            headers={
                "Cache-Control": f"private, max-age={max_age}",
                "X-Content-Type-Options": "nosniff",
            },
        )

    return get_artifact
