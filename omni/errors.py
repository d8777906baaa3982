"""The API's error type: an OpenAI error object ({"error": {"message", "type", "param",
"code"}}) with its HTTP status, and the helpers that name the common ones.

Every layer below HTTP raises these; omni/http/errors.py turns them (and the engines' and the
media layer's own errors) into responses. Nothing here imports aiohttp or an engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from omni.shared.log_format import current_request_id

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

class ErrorObject(Struct, kw_only=True):
    message: str
    type: str
    param: Annotated[str | None, Meta(description="The field the error is about, e.g. messages[0].content.")]
    code: str | None
    # An addition to OpenAI's four fields, which clients ignore: a user's error report then
    # finds the server's log lines.
    request_id: Annotated[str, Meta(description="The request's X-Request-Id, as in the server's logs.")] | UnsetType = (
        UNSET
    )


class Error(Struct):
    """Every error's body, whatever its status."""

    error: ErrorObject


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

    def body(self) -> Error:
        error = ErrorObject(message=self.message, type=self.type, param=self.param, code=self.code)
        rid = current_request_id.get()
        if rid:
            error.request_id = rid
        return Error(error)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self.body())
        return out


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


def internal_error(
    message: str = "The server had an error while processing your request.",
) -> APIError:
    return APIError(500, message)
