"""LocalStore: artifacts as files under a directory, served by omni-serve at signed URLs
(the route that serves them is the API's: omni/http/handlers/artifacts.py)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import tempfile
import time
from pathlib import Path

from omni.shared.store.base import ArtifactStore, KeyNotFound, StoreError, validate_key

# Where omni-serve serves signed artifact URLs (omni/http/handlers/artifacts.py routes it).
ARTIFACT_PATH = "/v1/artifacts/"
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
        return f"{self.url_base}{ARTIFACT_PATH}{key}?expires={expires}&sig={self.sign(key, expires)}"

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
