from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from omni.metrics import Metrics
from scheduler.request import Request, RequestId, SamplingParams


def _sample(m: Metrics, name: str, labels: dict[str, str]) -> float | None:
    return m.registry.get_sample_value(name, labels)


def _request(num_prompt: int, num_output: int, arrival: float) -> Request:
    r = Request(RequestId("r"), list(range(num_prompt)), SamplingParams(max_tokens=100))
    r.arrival_time = arrival
    r.output_token_ids = list(range(num_output))
    return r


def test_two_instances_do_not_clash() -> None:
    a, b = Metrics(), Metrics()
    a.observe_ttft("m", 0.5)
    assert _sample(a, "omni_time_to_first_token_seconds_count", {"model": "m"}) == 1
    assert _sample(b, "omni_time_to_first_token_seconds_count", {"model": "m"}) is None
    assert REGISTRY.get_sample_value("omni_time_to_first_token_seconds_count", {"model": "m"}) is None


def test_values() -> None:
    m = Metrics()
    m.request_finished("tiny", "stop", _request(7, 3, arrival=100.0), now=101.5)
    m.request_finished("tiny", "length", _request(4, 2, arrival=100.0), now=170.0)
    m.request_finished("other", "abort", _request(1, 0, arrival=100.0), now=100.0)
    m.observe_ttft("tiny", 0.03)
    m.observe_itl("tiny", 0.004)
    m.set_queue("tiny", "0", 3, 1)
    m.set_kv_usage("tiny", "0", 0.25)
    m.add_prefix_cache("tiny", "0", 32, 16)
    m.add_prefix_cache("tiny", "0", 16, 0)
    m.add_preemptions("tiny", "0")
    tiny, w = {"model": "tiny"}, {"model": "tiny", "worker": "0"}
    assert _sample(m, "omni_prompt_tokens_total", tiny) == 11
    assert _sample(m, "omni_generation_tokens_total", tiny) == 5
    assert _sample(m, "omni_prompt_tokens_total", {"model": "other"}) == 1
    assert _sample(m, "omni_requests_total", {"model": "tiny", "finish_reason": "stop"}) == 1
    assert _sample(m, "omni_requests_total", {"model": "tiny", "finish_reason": "length"}) == 1
    assert _sample(m, "omni_requests_total", {"model": "other", "finish_reason": "abort"}) == 1
    assert _sample(m, "omni_e2e_request_latency_seconds_bucket", {**tiny, "le": "60.0"}) == 1
    assert _sample(m, "omni_e2e_request_latency_seconds_bucket", {**tiny, "le": "120.0"}) == 2
    assert _sample(m, "omni_e2e_request_latency_seconds_sum", tiny) == 71.5
    assert _sample(m, "omni_time_to_first_token_seconds_bucket", {**tiny, "le": "0.02"}) == 0
    assert _sample(m, "omni_time_to_first_token_seconds_bucket", {**tiny, "le": "0.04"}) == 1
    assert _sample(m, "omni_inter_token_latency_seconds_bucket", {**tiny, "le": "0.005"}) == 1
    assert _sample(m, "omni_requests_running", w) == 3
    assert _sample(m, "omni_requests_waiting", w) == 1
    assert _sample(m, "omni_kv_cache_usage_ratio", w) == 0.25
    assert _sample(m, "omni_prefix_cache_queries_total", w) == 48
    assert _sample(m, "omni_prefix_cache_hits_total", w) == 16
    assert _sample(m, "omni_preemptions_total", w) == 1


async def test_render_served_by_aiohttp() -> None:
    m = Metrics()
    m.observe_ttft("tiny", 0.5)

    async def handler(request: web.Request) -> web.Response:
        body, content_type = m.render()
        # content_type carries a charset, which web.Response(content_type=...) rejects.
        return web.Response(body=body, headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/metrics", handler)
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/metrics")
        assert r.status == 200
        assert r.content_type == "text/plain"
        text = await r.text()
    assert 'omni_time_to_first_token_seconds_count{model="tiny"} 1.0' in text
    assert "# TYPE omni_time_to_first_token_seconds histogram" in text
