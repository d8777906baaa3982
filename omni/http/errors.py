"""OpenAI-style errors: {"error": {"message", "type", "param", "code"}} with the right status.

Handlers and the layers below raise APIError (omni/errors.py); error_middleware turns it, the
media layer's MediaError (a 400 naming the part), admission's Overloaded (a 429 with
Retry-After), an engine's EngineError (503; 504 for a passed deadline), any aiohttp HTTP error
(unknown route, wrong method, body too large) and any unexpected exception into that JSON
shape, so a client never sees an HTML error page.
"""

from __future__ import annotations

import logging

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from omni.engines.admission import Overloaded
from omni.engines.llm import DeadlineExceeded, EngineError, RefusedAtSubmit
from omni.errors import APIError, bad_request, internal_error, service_unavailable
from omni.shared.media.errors import MediaError

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


def too_many_requests(exc: Overloaded) -> APIError:
    """OpenAI's answer to a rate limit: 429, code rate_limit_exceeded, the type naming the
    limit ("requests", "tokens"), and when to retry; the OpenAI clients retry it themselves."""
    return APIError(
        429,
        exc.message,
        type=exc.limit.value,
        code="rate_limit_exceeded",
        headers={"Retry-After": str(exc.retry_after_s)},
    )


def engine_error(exc: EngineError) -> APIError:
    """A request its engine could not complete: a passed deadline is a 504 (gRPC's
    DEADLINE_EXCEEDED maps to it, and the server gave up on its own clock, not the client's),
    a refusal at submission a 429, a failed worker a 503."""
    if isinstance(exc, DeadlineExceeded):
        return APIError(504, str(exc), code="deadline_exceeded")
    if isinstance(exc, RefusedAtSubmit):
        return too_many_requests(exc.overloaded)
    return service_unavailable(str(exc))


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
    except APIError as e:
        # An API error raised from an engine error (assembly's 503 for any of them) answers
        # as that engine error does: a passed deadline is a 504, a refusal a 429.
        if isinstance(e.__cause__, EngineError):
            return error_response(engine_error(e.__cause__))
        return error_response(e)
    except MediaError as e:  # the media layer knows nothing of HTTP: its errors are the client's
        return error_response(bad_request(e.message, param=e.param))
    except Overloaded as e:
        return error_response(too_many_requests(e))
    except EngineError as e:
        return error_response(engine_error(e))
    except web.HTTPException as e:
        if e.status < 400:
            raise  # redirects and other non-errors pass through unchanged
        return error_response(from_http_exception(request, e))
    except Exception:
        logger.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(internal_error())
