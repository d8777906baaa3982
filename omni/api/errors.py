"""OpenAI-style errors: {"error": {"message", "type", "param", "code"}} with the right status.

Handlers raise APIError (usually through the helpers below); error_middleware turns it, the
media layer's MediaError (a 400 naming the part), admission's Overloaded (a 429 with
Retry-After), an engine's EngineError (503; 504 for a passed deadline), any aiohttp HTTP error
(unknown route, wrong method, body too large) and any unexpected exception into that JSON
shape, so a client never sees an HTML error page.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from omni.admission import Overloaded
from omni.engine import DeadlineExceeded, EngineError, RefusedAtSubmit
from omni.log_format import current_request_id
from omni.media.errors import MediaError

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

# Headers of an aiohttp exception worth keeping on the JSON response (e.g. Allow on a 405).
_DROPPED_HEADERS = frozenset({"content-type", "content-length"})


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or (SERVER_ERROR if status >= 500 else INVALID_REQUEST)
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def to_dict(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        # The request's X-Request-Id (an addition to OpenAI's four fields, which clients ignore),
        # so a user's error report finds the server's log lines.
        rid = current_request_id.get()
        if rid:
            error["request_id"] = rid
        return {"error": error}

    def to_response(self) -> web.Response:
        return web.Response(
            status=self.status,
            body=orjson.dumps(self.to_dict()),
            content_type="application/json",
            headers=self.headers,
        )


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unauthorized(message: str = "Invalid API key.") -> APIError:
    return APIError(401, message, code="invalid_api_key")


def not_found(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(404, message, param=param, code=code)


def model_not_found(model: str) -> APIError:
    return not_found(f"The model `{model}` does not exist.", param="model", code="model_not_found")


def payload_too_large(message: str) -> APIError:
    return APIError(413, message, code="payload_too_large")


def service_unavailable(message: str, *, retry_after_s: int | None = None) -> APIError:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return APIError(503, message, code="service_unavailable", headers=headers)


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


def internal_error(
    message: str = "The server had an error while processing your request.",
) -> APIError:
    return APIError(500, message)


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
            return engine_error(e.__cause__).to_response()
        return e.to_response()
    except MediaError as e:  # the media layer knows nothing of HTTP: its errors are the client's
        return bad_request(e.message, param=e.param).to_response()
    except Overloaded as e:
        return too_many_requests(e).to_response()
    except EngineError as e:
        return engine_error(e).to_response()
    except web.HTTPException as e:
        if e.status < 400:
            raise  # redirects and other non-errors pass through unchanged
        return from_http_exception(request, e).to_response()
    except Exception:
        logger.exception("unhandled error in %s %s", request.method, request.path)
        return internal_error().to_response()
