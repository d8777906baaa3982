"""The HTTP metrics middleware on a toy app: vLLM's (the instrumentator's) names and labels,
the route's template as handler, one "none" for whatever no route matched."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.http.app import add_routes
from omni.http.errors import error_middleware
from omni.http.metrics_middleware import http_metrics_middleware
from omni.http.state import MODELS
from omni.metrics import Metrics
from omni.serving.model import ModelRegistry


def _app(metrics: Metrics) -> web.Application:
    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    async def refuse(request: web.Request) -> web.Response:
        raise web.HTTPTooManyRequests(text="busy")

    async def crash(request: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(3):
            await response.write(b"data: {}\n\n")
            await asyncio.sleep(0)
        await response.write_eof()
        return response

    app = web.Application(middlewares=[http_metrics_middleware(metrics)])
    app.router.add_post("/v1/chat/completions", ok)
    app.router.add_get("/v1/models/{model}", ok)
    app.router.add_get("/artifacts/{key:.+}", ok)
    app.router.add_post("/v1/completions", stream)
    app.router.add_post("/refuse", refuse)
    app.router.add_get("/crash", crash)
    app.router.add_get("/health", ok)
    app.router.add_get("/metrics", ok)
    return app


async def test_requests_are_counted_by_route_template_method_and_status_class() -> None:
    m = Metrics()
    sample = m.registry.get_sample_value
    async with TestClient(TestServer(_app(m))) as client:
        assert (await client.post("/v1/chat/completions", data=b"x" * 10)).status == 200
        for path in ("/v1/models/a", "/v1/models/b", "/artifacts/k1/raw", "/artifacts/k2"):
            assert (await client.get(path)).status == 200
        assert (await client.get("/no/such/path")).status == 404
        assert (await client.get(f"/unknown/{'z' * 40}")).status == 404
        assert (await client.put("/v1/chat/completions")).status == 405
        assert (await client.post("/refuse")).status == 429
        assert (await client.get("/crash")).status == 500
        r = await client.post("/v1/completions")
        assert (await r.read()).count(b"data:") == 3
        await client.get("/health")
        await client.get("/metrics")

    def total(handler: str, method: str, status: str) -> float | None:
        return sample("http_requests_total", {"handler": handler, "method": method, "status": status})

    assert total("/v1/chat/completions", "POST", "2xx") == 1
    assert total("/v1/models/{model}", "GET", "2xx") == 2  # the template, not /v1/models/a
    assert total("/artifacts/{key}", "GET", "2xx") == 2
    assert total("none", "GET", "4xx") == 2  # every unknown path is the one series
    assert total("none", "PUT", "4xx") == 1
    assert total("/refuse", "POST", "4xx") == 1
    assert total("/crash", "GET", "5xx") == 1
    assert total("/v1/completions", "POST", "2xx") == 1
    handlers = {s.labels["handler"] for f in m.registry.collect() if f.name == "http_requests" for s in f.samples}
    assert handlers == {
        "/v1/chat/completions", "/v1/models/{model}", "/artifacts/{key}", "none", "/refuse", "/crash", "/v1/completions"
    }  # fmt: skip  # the probe and the scrape are not counted, as vLLM leaves them out
    post = {"handler": "/v1/chat/completions"}
    assert sample("http_request_size_bytes_sum", post) == 10
    assert sample("http_response_size_bytes_sum", post) == len(b'{"ok": true}')
    assert sample("http_response_size_bytes_sum", {"handler": "/v1/completions"}) == 0  # no Content-Length
    duration = {"handler": "/v1/completions", "method": "POST"}
    assert sample("http_request_duration_seconds_count", duration) == 1
    assert sample("http_request_duration_seconds_bucket", {**duration, "le": "+Inf"}) == 1
    assert sample("http_request_duration_highr_seconds_count") == 11


async def test_the_apps_own_routes_behind_its_error_middleware() -> None:
    """Outermost, the middleware sees what the client gets: an error the API turned into a JSON
    404 counts as a 4xx of the route the request matched. Under a root path, a route and its
    prefixed twin are one handler, and the prefixed probes are left out too."""
    m = Metrics()
    app = web.Application(middlewares=[http_metrics_middleware(m, root_path="/omni"), error_middleware])
    app[MODELS] = ModelRegistry()
    add_routes(app, "/omni")
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/v1/models")).status == 200
        assert (await client.get("/v1/models/nope")).status == 404
        assert (await client.get("/v1/nothing-here")).status == 404
        assert (await client.get("/omni/v1/models")).status == 200
        await client.get("/omni/health")
        await client.get("/omni/metrics")
    totals = {
        (s.labels["handler"], s.labels["status"]): s.value
        for f in m.registry.collect()
        if f.name == "http_requests"
        for s in f.samples
        if s.name == "http_requests_total"
    }
    assert totals == {("/v1/models", "2xx"): 2, ("/v1/models/{model}", "4xx"): 1, ("none", "4xx"): 1}
