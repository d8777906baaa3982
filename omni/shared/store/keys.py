"""Key layout of the artifact store: content-addressed encoder outputs, unique outputs."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping

from omni.shared.store.base import validate_key, validate_segment


def content_hash(media: bytes, params: Mapping[str, object]) -> str:
    """sha256 over the media bytes and the canonical JSON of the preprocessing params."""
    # The media length goes first so (media, params) pairs cannot collide by moving
    # bytes across the boundary between the two.
    canonical = json.dumps(
        dict(params), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()
    h = hashlib.sha256()
    h.update(len(media).to_bytes(8, "big"))
    h.update(media)
    h.update(canonical)
    return h.hexdigest()


def encoder_key(component: str, revision: str, media: bytes, params: Mapping[str, object]) -> str:
    """enc/<component>/<revision>/<sha256 of media + params>: the same media skips the encoder."""
    return encoder_key_for(component, revision, content_hash(media, params))


def encoder_key_for(component: str, revision: str, digest: str) -> str:
    """encoder_key with content_hash already computed (one hash serves every component)."""
    validate_segment("component", component)
    validate_segment("revision", revision)
    return validate_key(f"enc/{component}/{revision}/{digest}")


def output_key(kind: str, ext: str) -> str:
    """out/<kind>/<uuid4 hex>.<ext>: a fresh name for one generated image or audio clip."""
    validate_segment("kind", kind)
    if not ext.isascii() or not ext.isalnum():
        raise ValueError(f"invalid extension {ext!r}: want letters and digits only")
    return validate_key(f"out/{kind}/{uuid.uuid4().hex}.{ext}")
