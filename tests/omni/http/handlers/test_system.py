"""/v1/models, /health (and its aliases) and /metrics over HTTP: the model cards, a 503 naming
the models still starting, and the metrics in Prometheus' text format. (/version and /ping's
answer are tests/omni/http/handlers/test_tokenize.py's.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.engines.pool import ModelPool
from omni.http.app import add_routes
from omni.http.errors import error_middleware
from omni.http.state import METRICS, MODELS
from omni.metrics import Metrics
from omni.serving.model import ModelRegistry, ServedModel
from omni.text.tokenizer import TextTokenizer
from tests.omni.fake_pool import FakePool


@dataclass
class ReadyPool(FakePool):
    ready: bool = True


@pytest.fixture
async def served(tiny_tokenizer_dir: Path) -> AsyncIterator[tuple[TestClient[Any, Any], list[ReadyPool]]]:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    pools = [ReadyPool([1], max_model_len=512), ReadyPool([1], max_model_len=0)]
    app = web.Application(middlewares=[error_middleware])
    app[MODELS] = ModelRegistry()
    app[MODELS].add(ServedModel("alpha", tokenizer, cast(ModelPool, pools[0]), created=100))
    app[MODELS].add(ServedModel("beta", tokenizer, cast(ModelPool, pools[1]), created=200), aliases=("b",))
    app[METRICS] = Metrics()
    add_routes(app)
    async with TestClient(TestServer(app)) as client:
        yield client, pools


async def test_the_models_are_listed_with_their_cards(served: tuple[TestClient[Any, Any], list[ReadyPool]]) -> None:
    client, _ = served
    r = await client.get("/v1/models")
    assert r.status == 200
    body = await r.json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["created"], m["owned_by"], m["max_model_len"]) for m in body["data"]] == [
        ("alpha", "model", 100, "omni-serve", 512),
        ("beta", "model", 200, "omni-serve", None),  # not known yet: null, not 0
    ]


async def test_one_model_by_its_name_or_alias_and_an_unknown_is_a_404(served: tuple[TestClient[Any, Any], list[ReadyPool]]) -> None:
    client, _ = served
    assert (await (await client.get("/v1/models/alpha")).json())["id"] == "alpha"
    assert (await (await client.get("/v1/models/b")).json())["id"] == "beta"
    missing = await client.get("/v1/models/gamma")
    assert missing.status == 404
    assert (await missing.json())["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("path", ["/health", "/ready", "/ping"])
async def test_health_is_ok_only_when_every_model_is_ready(served: tuple[TestClient[Any, Any], list[ReadyPool]], path: str) -> None:
    client, pools = served
    r = await client.get(path)
    assert (r.status, await r.json()) == (200, {"status": "ok"})
    pools[1].ready = False
    r = await client.get(path)
    assert r.status == 503
    assert await r.json() == {"status": "starting", "not_ready": ["beta"]}


async def test_metrics_are_prometheus_text(served: tuple[TestClient[Any, Any], list[ReadyPool]]) -> None:
    client, _ = served
    r = await client.get("/metrics")
    assert r.status == 200 and r.headers["Content-Type"] == "text/plain; version=1.0.0; charset=utf-8"
    text = await r.text()
    assert "# TYPE omni_requests_rejected_total counter" in text.splitlines()
    assert "process_" in text  # the process collector is on the app's registry
