"""The artifact store (data plane): encoder outputs and generated media, on disk or in S3."""

from omni.store.base import (
    ArtifactStore,
    KeyNotFound,
    StoreError,
    store_backends,
    store_class,
    validate_key,
)
from omni.store.keys import encoder_key, output_key
from omni.store.local import ARTIFACT_ROUTE, LocalStore, artifact_route
from omni.store.s3 import S3Store

__all__ = [
    "ARTIFACT_ROUTE",
    "ArtifactStore",
    "KeyNotFound",
    "LocalStore",
    "S3Store",
    "StoreError",
    "artifact_route",
    "encoder_key",
    "output_key",
    "store_backends",
    "store_class",
    "validate_key",
]
