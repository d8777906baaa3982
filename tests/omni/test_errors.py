"""APIError: OpenAI's error object with its status; the type follows the status, the request's
id rides along when there is one, and each helper names its status and code."""

from __future__ import annotations

from omni.errors import (
    APIError,
    bad_request,
    internal_error,
    model_not_found,
    not_found,
    payload_too_large,
    service_unavailable,
    unauthorized,
)
from omni.shared.log_format import current_request_id


def test_the_body_is_openais_four_fields() -> None:
    error = APIError(400, "Bad 'n'.", param="n", code="invalid_value")
    assert error.to_dict() == {"error": {"message": "Bad 'n'.", "type": "invalid_request_error", "param": "n", "code": "invalid_value"}}
    assert str(error) == "Bad 'n'." and error.headers == {}


def test_the_type_follows_the_status_unless_named() -> None:
    assert APIError(429, "slow down").type == "invalid_request_error"
    assert APIError(503, "down").type == "server_error"
    assert APIError(429, "full", type="tokens").type == "tokens"


def test_the_requests_id_is_added_when_the_request_has_one() -> None:
    token = current_request_id.set("req-42")
    try:
        assert APIError(400, "x").to_dict()["error"]["request_id"] == "req-42"
    finally:
        current_request_id.reset(token)
    assert "request_id" not in APIError(400, "x").to_dict()["error"]


def test_each_helper_is_its_status_and_code() -> None:
    made = [
        bad_request("b", param="p"), unauthorized(), not_found("n"), model_not_found("gpt-9"),
        payload_too_large("big"), service_unavailable("later", retry_after_s=5), internal_error(),
    ]  # fmt: skip
    assert [(e.status, e.code, e.param) for e in made] == [
        (400, None, "p"), (401, "invalid_api_key", None), (404, None, None), (404, "model_not_found", "model"),
        (413, "payload_too_large", None), (503, "service_unavailable", None), (500, None, None),
    ]  # fmt: skip
    assert str(made[3]) == "The model `gpt-9` does not exist."
    assert made[5].headers == {"Retry-After": "5"} and service_unavailable("x").headers == {}
    assert made[6].type == "server_error"
