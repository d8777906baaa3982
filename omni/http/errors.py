"""OpenAI-style errors: {"error": {"message", "type", "param", "code"}} with the right status.

Handlers and the layers below raise APIError (omni/errors.py); error_middleware turns it, and
whatever else omni/serving/errors.py:api_error maps (the media layer's errors, admission's
refusals, an engine's failures), any aiohttp HTTP error (unknown route, wrong method, body too
large) and any unexpected exception into that JSON shape, so a client never sees an HTML
error page.
"""

from __future__ import annotations

import logging

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from omni.errors import APIError, internal_error
from omni.serving.errors import api_error

logger = logging.getLogger(__name__)

# Headers of an aiohttp exception worth keeping on the JSON response (e.g. Allow on a 405).
_DROPPED_HEADERS = frozenset({"content-type", "content-length"})


def error_response(error: APIError) -> web.Response:
    return web.Response(
        status=error.status,
        body=msgspec.json.encode(error.body()),
        content_type="application/json",
        headers=error.headers,
    )


def from_http_exception(request: web.Request, exc: web.HTTPException) -> APIError:
    headers = {k: v for k, v in exc.headers.items() if k.lower() not in _DROPPED_HEADERS}
    if isinstance(exc, web.HTTPNotFound):
        message = f"Unknown route: {request.method} {request.path}"
        code: str | None = "not_found"
    elif isinstance(exc, web.HTTPMethodNotAllowed):
        message = f"Method {exc.method} is not allowed for {request.path}"
        code = "method_not_allowed"
    elif isinstance(exc, web.HTTPRequestEntityTooLarge):
        # aiohttp's text names the limit and the actual size: useful to the client.
        message = exc.text or exc.reason
        code = "payload_too_large"
    else:
        message = exc.text or exc.reason
        code = None
    return APIError(exc.status, message, code=code, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    # A handler that has already started a streamed (SSE) response must report its own
    # errors in the stream: a new response cannot replace one whose headers were sent.
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise  # redirects and other non-errors pass through unchanged
        return error_response(from_http_exception(request, e))
    except Exception as e:
        error = api_error(e)  # the one mapping, a realtime response's too
        if error is None:
            logger.exception("unhandled error in %s %s", request.method, request.path)
            error = internal_error()
        return error_response(error)
