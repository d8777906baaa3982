"""GET /v1/artifacts/{key}: the local store's signed, expiring URLs, served by omni-serve.

An S3 store hands out presigned URLs of its own, so there this route is a 404. The signature
is the authorization: the route is open to requests without the bearer key.
"""

from __future__ import annotations

import mimetypes
import time

from aiohttp import web

from omni.errors import APIError, not_found
from omni.http.errors import error_response
from omni.http.state import STORE
from omni.shared.store.base import KeyNotFound, StoreError
from omni.shared.store.local import ARTIFACT_PATH, LocalStore

__all__ = ["ARTIFACT_PATH", "ARTIFACT_ROUTE", "get_artifact", "serve_artifact"]

ARTIFACT_ROUTE = ARTIFACT_PATH + "{key:.+}"


async def get_artifact(request: web.Request) -> web.StreamResponse:
    store = request.app[STORE]
    if not isinstance(store, LocalStore):
        raise web.HTTPNotFound()
    return await serve_artifact(store, request)


async def serve_artifact(store: LocalStore, request: web.Request) -> web.StreamResponse:
    """Check the signed URL, then serve the bytes."""
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
        return error_response(not_found(f"Artifact `{key}` does not exist.", code="not_found"))
    except StoreError:
        return error_response(APIError(500, "The artifact could not be read."))
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


def _forbidden(message: str) -> web.Response:
    return error_response(APIError(403, message, code="invalid_signature"))
