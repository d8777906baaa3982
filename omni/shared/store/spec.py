"""`--store` flag values: `local:DIR` (the default, under the cache root) or `s3://BUCKET/PREFIX`."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from omni.shared.store.base import ArtifactStore, store_class


def default_store_dir() -> Path:
    root = os.environ.get("OMNI_SERVE_CACHE") or Path.home() / ".cache" / "omni-serve"
    return Path(root) / "artifacts"


@dataclass(frozen=True, slots=True)
class StoreSpec:
    backend: str  # "local" | "s3"
    location: str  # a directory, or the bucket
    prefix: str = ""

    @classmethod
    def parse(cls, text: str) -> StoreSpec:
        if not text:
            return cls("local", str(default_store_dir()))
        if text.startswith("local:"):
            directory = text.removeprefix("local:")
            if not directory:
                raise ValueError("--store local: needs a directory, e.g. local:/var/lib/omni")
            return cls("local", str(Path(directory).expanduser()))
        if text.startswith("s3://"):
            url = urlparse(text)
            if not url.netloc:
                raise ValueError(f"--store {text!r}: no bucket (s3://BUCKET/PREFIX)")
            return cls("s3", url.netloc, url.path.strip("/"))
        raise ValueError(f"--store {text!r}: use local:DIR or s3://BUCKET/PREFIX")

    def open(
        self,
        *,
        url_base: str,
        secret: bytes | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
    ) -> ArtifactStore:
        """The store, not yet started. A local store without a secret gets a random one, so
        its signed URLs stop working when the process restarts."""
        cls = store_class(self.backend)  # imports the S3 client only for an s3:// store
        if self.backend == "local":
            return cls(Path(self.location), url_base, secret or secrets.token_bytes(32))  # type: ignore[call-arg]
        return cls(self.location, self.prefix, endpoint_url=endpoint_url, region=region)  # type: ignore[call-arg]
