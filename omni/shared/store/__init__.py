"""The artifact store (data plane): encoder outputs and generated media, on disk or in S3.

A shared layer: the server and the workers both use it; it imports neither torch nor aiohttp's
web layer. S3Store (aiobotocore) is imported only when an s3:// store is opened or named.
"""

from omni.shared.store.base import (
    ArtifactStore,
    KeyNotFound,
    StoreError,
    store_backends,
    store_class,
    validate_key,
)
from omni.shared.store.keys import encoder_key, output_key
from omni.shared.store.local import LocalStore

__all__ = [
    "ArtifactStore",
    "KeyNotFound",
    "LocalStore",
    "StoreError",
    "encoder_key",
    "output_key",
    "store_backends",
    "store_class",
    "validate_key",
]
