"""The artifact store interface: one small async key -> bytes API over local disk or S3.

Large tensors (encoder outputs) and generated media live here instead of travelling over
worker pipes; see "Data plane: the artifact store" in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
import re
from abc import ABC, abstractmethod
from types import TracebackType
from typing import ClassVar

MAX_KEY_LENGTH = 512
# One path segment: safe characters only, and not starting with "." so that ".", "..",
# hidden files and LocalStore's ".tmp-" files can never be addressed by a key.
_SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9._-]*"
_KEY_RE = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*")
_SEGMENT_RE = re.compile(_SEGMENT)


class StoreError(Exception):
    """The backend failed (disk, network, credentials); the key may or may not exist."""


class KeyNotFound(KeyError):
    """The key is not in the store."""

    def __str__(self) -> str:  # KeyError's str() is repr(key); keep the plain message
        return str(self.args[0]) if self.args else "key not found"


def validate_key(key: str) -> str:
    """Return key unchanged, or raise ValueError: relative, no "..", charset [A-Za-z0-9._/-]."""
    if not isinstance(key, str):
        raise ValueError(f"store key must be a str, got {type(key).__name__}")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"store key longer than {MAX_KEY_LENGTH} characters")
    if not _KEY_RE.fullmatch(key):
        raise ValueError(
            f"invalid store key {key!r}: want relative '/'-separated segments of "
            "[A-Za-z0-9._-], none empty or starting with '.'"
        )
    return key


def validate_segment(name: str, value: str) -> str:
    if not isinstance(value, str) or not _SEGMENT_RE.fullmatch(value):
        raise ValueError(f"invalid {name} {value!r}: want one key segment of [A-Za-z0-9._-]")
    return value


class ArtifactStore(ABC):
    """Async key -> bytes store. Subclasses register under a backend name:

        class LocalStore(ArtifactStore, backend="local"): ...
    """

    backend: ClassVar[str]
    _registry: ClassVar[dict[str, type[ArtifactStore]]] = {}

    def __init_subclass__(cls, backend: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if backend is not None:
            if backend in ArtifactStore._registry:
                raise ValueError(f"store backend {backend!r} registered twice")
            cls.backend = backend
            ArtifactStore._registry[backend] = cls

    @abstractmethod
    async def put(
        self, key: str, data: bytes, content_type: str = "application/octet-stream"
    ) -> None:
        """Publish data under key atomically: readers see the old value or all of the new."""

    @abstractmethod
    async def get(self, key: str) -> bytes:
        """Raises KeyNotFound when absent, StoreError when the backend fails."""

    async def read_head(self, key: str, length: int) -> tuple[bytes, int]:
        """The first `length` bytes (fewer if the artifact is shorter) and the artifact's total
        size: enough to read a safetensors header without fetching megabytes of embeddings.
        Raises as get() does. Backends override this with a ranged read."""
        data = await self.get(key)
        return data[:length], len(data)

    @abstractmethod
    async def exists(self, key: str) -> bool: ...

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Idempotent: deleting a missing key is not an error."""

    @abstractmethod
    async def url(self, key: str, expires_s: int) -> str:
        """A URL a client can GET the artifact from for the next expires_s seconds."""

    async def start(self) -> None:
        """Open connections; a no-op for backends that need none."""

    async def close(self) -> None:
        """Release connections; a no-op for backends that hold none."""

    async def __aenter__(self) -> ArtifactStore:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


# Where each backend is defined. A backend's module is imported only when that backend is
# used, so a process on the local store never loads aiobotocore (nor aiohttp with it).
_BACKEND_MODULES = {"local": "omni.shared.store.local", "s3": "omni.shared.store.s3"}


def store_backends() -> dict[str, type[ArtifactStore]]:
    """Every backend, importing each (for listings and tests; serving uses store_class)."""
    for backend in _BACKEND_MODULES:
        store_class(backend)
    return dict(ArtifactStore._registry)


def store_class(backend: str) -> type[ArtifactStore]:
    module = _BACKEND_MODULES.get(backend)
    if module is None:
        raise ValueError(
            f"unknown store backend {backend!r}; known: {', '.join(sorted(_BACKEND_MODULES))}"
        )
    if backend not in ArtifactStore._registry:
        importlib.import_module(module)  # defining the class registers it
    return ArtifactStore._registry[backend]
