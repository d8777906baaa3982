"""HTTP request metrics as vLLM exposes them (prometheus-fastapi-instrumentator's defaults):
http_requests_total{method,status,handler}, http_request_duration_seconds{method,handler},
http_request_duration_highr_seconds, http_request_size_bytes{handler} and
http_response_size_bytes{handler}.

handler is the route's canonical path (/v1/chat/completions, /v1/models/{model}), never the
raw one: a request no route matched (an unknown path, a wrong method) is "none", so no client
can grow the series without bound. status is grouped as the instrumentator groups it (2xx,
4xx, 5xx). Probes and the scrape itself are left out, as vLLM leaves them out.

A streamed response (SSE) is timed until its handler returns, which is when the stream ends.
Sizes are the Content-Length each side declared (0 for a stream without one), as there.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from omni.metrics import Metrics

# vLLM's excluded_handlers, of the routes omni-serve has.
EXCLUDED_HANDLERS = frozenset({"/metrics", "/health", "/ready", "/ping", "/version"})
UNMATCHED = "none"  # the instrumentator's handler for a request no route template matched
# nginx's status for a client that left before its response (as omni/http/app.py answers it).
_CLIENT_GONE = 499


def handler_name(request: web.Request, root_path: str = "") -> str:
    """The route's template; under a root path the route it repeats (as vLLM's handler is the
    route's own path whatever --root-path is)."""
    resource = request.match_info.route.resource
    if resource is None:
        return UNMATCHED
    name = resource.canonical
    if root_path and name.startswith(root_path + "/"):
        return name[len(root_path) :]
    return name


def http_metrics_middleware(metrics: Metrics, *, root_path: str = "") -> Middleware:
    """root_path: the prefix the routes are also served under (omni/http/app.py add_routes)."""

    @web.middleware
    async def http_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
        name = handler_name(request, root_path)
        if name in EXCLUDED_HANDLERS:
            return await handler(request)
        started = time.perf_counter()
        status, response_bytes = 500, 0
        try:
            response = await handler(request)
            status, response_bytes = response.status, response.content_length or 0
            return response
        except web.HTTPException as e:  # raised rather than returned: still an answer
            status, response_bytes = e.status, e.content_length or 0
            raise
        except asyncio.CancelledError:  # the client left and the handler was cancelled
            status = _CLIENT_GONE
            raise
        finally:
            metrics.observe_http(
                name,
                request.method,
                status,
                time.perf_counter() - started,
                request.content_length or 0,
                response_bytes,
            )

    return http_metrics
