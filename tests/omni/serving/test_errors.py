"""The one mapping of what ended a request to the API's error (omni/serving/errors.py); the
HTTP middleware (tests/omni/http/test_errors.py) and a realtime response
(tests/omni/serving/realtime/test_session.py) are checked against it with CASES."""

from __future__ import annotations

import pytest

from omni import errors
from omni.engines.admission import Limit, Overloaded
from omni.engines.llm import DeadlineExceeded, EngineError, RefusedAtSubmit
from omni.errors import APIError
from omni.serving.errors import api_error
from omni.shared.media.errors import MediaError


def _from_engine(cause: EngineError) -> APIError:
    error = errors.service_unavailable("assembly failed")
    error.__cause__ = cause
    return error


# (what was raised, status, type, code, param) of the error it maps to
CASES = [
    (errors.model_not_found("nope"), 404, "invalid_request_error", "model_not_found", "model"),
    (MediaError("could not decode the image", param="messages[0].content[1]"), 400, "invalid_request_error", None,
     "messages[0].content[1]"),
    (Overloaded("m", Limit.TOKENS, "The model's queue is full.", 7), 429, "tokens", "rate_limit_exceeded", None),
    (RefusedAtSubmit(Overloaded("m", Limit.REQUESTS, "full", 3)), 429, "requests", "rate_limit_exceeded", None),
    (DeadlineExceeded("past its deadline"), 504, "server_error", "deadline_exceeded", None),
    (EngineError("llm worker failed"), 503, "server_error", "service_unavailable", None),
    (_from_engine(DeadlineExceeded("late")), 504, "server_error", "deadline_exceeded", None),
]  # fmt: skip
IDS = [type(c[0]).__name__ + ("_from_engine" if c[0].__cause__ else "") for c in CASES]


@pytest.mark.parametrize(("exc", "status", "type_", "code", "param"), CASES, ids=IDS)
def test_each_error_maps_to_its_status_type_and_code(
    exc: BaseException, status: int, type_: str, code: str | None, param: str | None
) -> None:
    error = api_error(exc)
    assert error is not None
    assert (error.status, error.type, error.code, error.param) == (status, type_, code, param)


def test_a_refusal_says_when_to_retry() -> None:
    error = api_error(RefusedAtSubmit(Overloaded("m", Limit.REQUESTS, "full", 3)))
    assert error is not None and error.headers == {"Retry-After": "3"}


def test_an_api_error_is_itself() -> None:
    raised = errors.bad_request("no", param="n")
    assert api_error(raised) is raised


def test_anything_else_is_a_bug_the_caller_logs() -> None:
    assert api_error(RuntimeError("secret detail")) is None
    assert api_error(ValueError("x")) is None
