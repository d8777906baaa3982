"""Request ids and the access log.

Every request gets an id: the client's `X-Request-Id` when it sends a usable one (printable
ASCII, at most 128 characters, as proxies and gateways generate them), else a fresh one. The
id comes back as `X-Request-Id` on every response, streamed or not, errors included (it is set
when the headers are prepared), and it is on the request's access log line.

The access log (`omni.access`, one line per request, off with --disable-log-requests):

    POST /v1/chat/completions 200 model=omni-tiny prompt_tokens=12 output_tokens=32 ttft_ms=41.2 latency_ms=388.0 request_id=...

The generation endpoints note their model and choices on the request (note_generation); other
requests log the method, path, status, latency and id alone. A probe that succeeds (/health,
/ready, /ping, /metrics) logs at debug level, so probes every few seconds do not drown the log.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.typedefs import Handler

from omni.engines.generation import Usage
from omni.shared.log_format import current_request_id

HEADER = "X-Request-Id"
_USABLE = re.compile(r"^[\x21-\x7e]{1,128}$")  # printable ASCII, no spaces
REQUEST_ID = web.RequestKey("request_id", str)
_CLIENT_GAVE_ID = web.RequestKey("client_gave_id", bool)
_STARTED = web.RequestKey("started", float)

log = logging.getLogger("omni.access")
_PROBES = frozenset({"/health", "/ready", "/ping", "/metrics"})


class _Choice(Protocol):
    usage: Usage
    first_token_time: float | None


@dataclass(frozen=True, slots=True)
class _Noted:
    model: str
    choices: Sequence[_Choice]


_GENERATION = web.RequestKey("generation", _Noted)


def request_id(request: web.Request) -> str:
    """The request's id (the middleware assigned it)."""
    return request.get(REQUEST_ID, "")


def client_request_id(request: web.Request) -> str | None:
    """The client's own X-Request-Id, None when the server made the id up: a client's id names
    the response (chatcmpl-<id>), as vLLM names it."""
    return request_id(request) if request.get(_CLIENT_GAVE_ID, False) else None


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost: every response, an error's included, carries the id."""
    given = request.headers.get(HEADER, "")
    usable = _USABLE.match(given) is not None
    rid = given if usable else uuid.uuid4().hex
    request[REQUEST_ID] = rid
    request[_CLIENT_GAVE_ID] = usable
    request[_STARTED] = time.monotonic()
    # Every log line of this request's task, and of the tasks it starts, carries the id.
    current_request_id.set(rid)
    return await handler(request)


async def add_request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: right before the headers go out, for streamed responses too."""
    rid = request_id(request)
    if rid:
        response.headers[HEADER] = rid


def note_generation(request: web.Request, model: str, choices: Sequence[_Choice]) -> None:
    """What the access line reports of a generation: its model, tokens and first token."""
    request[_GENERATION] = _Noted(model, choices)


class AccessLogger(AbstractAccessLogger):
    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:  # noqa: A002
        values: dict[str, object] = {"method": request.method, "path": request.path, "status": response.status}
        noted = request.get(_GENERATION)
        if isinstance(noted, _Noted) and noted.choices:
            values["model"] = noted.model
            values["prompt_tokens"] = noted.choices[0].usage.prompt_tokens  # one prompt for every choice
            values["output_tokens"] = sum(c.usage.completion_tokens for c in noted.choices)
            firsts = [c.first_token_time for c in noted.choices if c.first_token_time is not None]
            started = request.get(_STARTED)
            if firsts and isinstance(started, float):
                values["ttft_ms"] = round((min(firsts) - started) * 1000, 1)
        values["latency_ms"] = round(time * 1000, 1)
        rid = request.get(REQUEST_ID, "-")
        text = f"{request.method} {request.path} {response.status}"
        text += "".join(f" {k}={v}" for k, v in values.items() if k not in ("method", "path", "status"))
        # probes come every few seconds from systemd, Kubernetes and Prometheus: debug lines
        level = logging.DEBUG if request.path in _PROBES and response.status < 400 else logging.INFO
        # The fields ride on the record too: JSON lines get them as keys (omni/shared/log_format.py).
        self.logger.log(level, f"{text} request_id={rid}", extra={**values, "request_id": rid})

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)
