"""What ended a request, as the OpenAI error the API answers with: one mapping, read by the
HTTP middleware (omni/http/errors.py, which adds aiohttp's own HTTP errors) and by a realtime
response's `error` event (omni/serving/realtime/session.py), so a refusal or a failure reads
the same over both. It knows nothing of aiohttp.

    APIError                 as it is (one raised from an engine's error: as that error)
    MediaError               400 naming the part (the media layer knows nothing of HTTP)
    Overloaded               429 rate_limit_exceeded, typed by the limit, with Retry-After
    DeadlineExceeded         504 deadline_exceeded
    RefusedAtSubmit          429, as its Overloaded
    any other EngineError    503 service_unavailable
    anything else            None: a bug; the caller logs it and answers internal_error()
"""

from __future__ import annotations

from omni.engines.admission import Overloaded
from omni.engines.llm import DeadlineExceeded, EngineError, RefusedAtSubmit
from omni.errors import APIError, bad_request, service_unavailable
from omni.shared.media.errors import MediaError


def api_error(exc: BaseException) -> APIError | None:
    """The API's error for exc; None for an exception no layer raises on purpose."""
    if isinstance(exc, APIError):
        # An API error raised from an engine error (assembly's 503 for any of them) answers
        # as that engine error does: a passed deadline is a 504, a refusal a 429.
        return engine_error(exc.__cause__) if isinstance(exc.__cause__, EngineError) else exc
    if isinstance(exc, MediaError):
        return bad_request(exc.message, param=exc.param)
    if isinstance(exc, Overloaded):
        return too_many_requests(exc)
    if isinstance(exc, EngineError):
        return engine_error(exc)
    return None


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
