"""CORS: which browser pages on other origins may call the API (--allowed-origins and friends).

Off by default (ServerConfig.cors is None): no CORS headers, a preflight gets the 405 of any
OPTIONS, so only same-origin pages (and non-browser clients, which ignore CORS) can call.

With a policy, install_cors adds two things, following the Fetch standard's CORS protocol:

- a middleware, outermost (inside only the request id's), that answers every preflight (OPTIONS with Origin and
  Access-Control-Request-Method) itself, for any path: 204 and the Allow-* headers when the
  origin, the method and every requested header are allowed, else a 403 without them (the
  browser then refuses the real request). Answering before the auth middleware matters: a
  browser never sends Authorization on a preflight, so a key check there would refuse it.
- an on_response_prepare hook that marks every other response to an allowed origin (the
  origin, the exposed headers, credentials): prepare runs for errors, and for streamed (SSE)
  responses, which a handler prepares itself before any middleware sees them.

A wildcard is never sent where the standard gives it no meaning: with credentials the
origin is echoed (a credentialed request refuses Allow-Origin: *), and requested methods and
headers are echoed rather than answered with "*" (which does not cover Authorization).
"""

from __future__ import annotations

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from omni.config import CorsPolicy
from omni.errors import APIError
from omni.http.access_log import HEADER as REQUEST_ID_HEADER
from omni.http.access_log import request_id_middleware
from omni.http.errors import error_response

ANY = "*"
# Response headers a page's script may read beyond the CORS-safelisted ones: the request id
# (to quote in a bug report) and when to retry a 429 or 503.
EXPOSED_HEADERS = (REQUEST_ID_HEADER, "Retry-After")
# Request headers a browser may send without them being listed by the server; Content-Type
# only shows up in Access-Control-Request-Headers for a non-form type (application/json),
# which every API call has, so it is allowed whatever the policy lists.
_ALWAYS_ALLOWED_HEADERS = frozenset({"accept", "accept-language", "content-language", "content-type"})


def install_cors(app: web.Application, policy: CorsPolicy) -> None:
    """Answer preflights and mark responses for the policy's origins (before the app starts)."""
    cors = _Cors(policy)
    # Outermost but for the request id's (which only names the request, and refuses nothing):
    # before auth, errors and routing, and a preflight's answer carries its X-Request-Id too.
    stack = list(app.middlewares)
    first = stack.index(request_id_middleware) + 1 if request_id_middleware in stack else 0
    app.middlewares.insert(first, cors.middleware)
    app.on_response_prepare.append(cors.on_response_prepare)


def is_preflight(request: web.BaseRequest) -> bool:
    headers = request.headers
    return (
        request.method == hdrs.METH_OPTIONS
        and hdrs.ORIGIN in headers
        and hdrs.ACCESS_CONTROL_REQUEST_METHOD in headers
    )


def _normalize_origin(origin: str) -> str:
    # Browsers serialize an origin lowercase, without a path; a flag may carry a trailing "/".
    return origin.strip().rstrip("/").lower()


def _add_vary(response: web.StreamResponse, *names: str) -> None:
    present = [v.strip() for v in response.headers.get(hdrs.VARY, "").split(",") if v.strip()]
    lowered = {v.lower() for v in present}
    present += [n for n in names if n.lower() not in lowered]
    response.headers[hdrs.VARY] = ", ".join(present)


class _Cors:
    def __init__(self, policy: CorsPolicy) -> None:
        self.policy = policy
        self.any_origin = ANY in policy.origins
        self.origins = frozenset(_normalize_origin(o) for o in policy.origins if o != ANY)
        self.any_method = ANY in policy.methods
        self.methods = frozenset(m.strip().upper() for m in policy.methods if m != ANY)
        self.any_header = ANY in policy.headers
        self.headers = frozenset(h.strip().lower() for h in policy.headers if h != ANY) | _ALWAYS_ALLOWED_HEADERS
        # "*" answers any origin only without credentials; otherwise the origin is echoed, and
        # the answer varies by Origin (a cache must not hand one origin's answer to another).
        self.echo_origin = not (self.any_origin and not policy.allow_credentials)

    def allows_origin(self, origin: str) -> bool:
        return self.any_origin or _normalize_origin(origin) in self.origins

    def _mark_origin(self, response: web.StreamResponse, origin: str) -> None:
        response.headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin if self.echo_origin else ANY
        if self.policy.allow_credentials:
            response.headers[hdrs.ACCESS_CONTROL_ALLOW_CREDENTIALS] = "true"

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_preflight(request):
            return self.preflight(request)
        return await handler(request)

    def preflight(self, request: web.Request) -> web.StreamResponse:
        origin = request.headers[hdrs.ORIGIN]
        method = request.headers[hdrs.ACCESS_CONTROL_REQUEST_METHOD].strip()
        asked = [h.strip() for h in request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS, "").split(",")]
        asked = [h for h in asked if h]
        refused = self._refusal(origin, method, asked)
        if refused is not None:
            # No Allow-* headers: the browser reports a CORS failure and sends nothing more.
            response: web.StreamResponse = error_response(APIError(403, refused, code="cors_forbidden"))
        else:
            response = web.Response(status=204)
            self._mark_origin(response, origin)
            response.headers[hdrs.ACCESS_CONTROL_ALLOW_METHODS] = (
                method if self.any_method else ", ".join(sorted(self.methods))
            )
            if asked:
                response.headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = ", ".join(asked)
            response.headers[hdrs.ACCESS_CONTROL_MAX_AGE] = str(self.policy.max_age)
        if self.echo_origin:
            _add_vary(response, hdrs.ORIGIN)
        if self.any_method or asked:  # what was echoed depends on these request headers
            _add_vary(response, hdrs.ACCESS_CONTROL_REQUEST_METHOD, hdrs.ACCESS_CONTROL_REQUEST_HEADERS)
        return response

    def _refusal(self, origin: str, method: str, asked: list[str]) -> str | None:
        """Why a preflight is refused, or None when it is allowed."""
        if not self.allows_origin(origin):
            return f"CORS: origin {origin} is not allowed"
        if not self.any_method and method.upper() not in self.methods:
            return f"CORS: method {method} is not allowed"
        if not self.any_header:
            # header names are case-insensitive; browsers send them lowercase, a flag may not
            bad = [h for h in asked if h.lower() not in self.headers]
            if bad:
                return f"CORS: request headers not allowed: {', '.join(bad)}"
        return None

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        if is_preflight(request):
            return  # answered in full by preflight()
        origin = request.headers.get(hdrs.ORIGIN)
        if self.echo_origin:
            _add_vary(response, hdrs.ORIGIN)  # with or without an Origin: a cache keys on it
        if origin is None or not self.allows_origin(origin):
            return  # no CORS headers: the browser keeps the response from the page
        self._mark_origin(response, origin)
        response.headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = ", ".join(EXPOSED_HEADERS)
