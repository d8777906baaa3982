import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from omni.engines.pool import choice_groups
from omni.metrics import ChoiceGroup, Metrics, one_two_five
from scheduler.request import MediaSpan, Request, RequestId, SamplingParams

TINY = {"model_name": "tiny", "engine": "0"}


def _sample(m: Metrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return m.registry.get_sample_value(name, labels or {})


def _request(num_prompt: int, num_output: int, *, arrival: float = 100.0, max_tokens: int = 100) -> Request:
    r = Request(RequestId("r"), list(range(num_prompt)), SamplingParams(max_tokens=max_tokens))
    r.arrival_time = arrival
    r.output_token_ids = list(range(num_output))
    return r


def test_two_instances_do_not_clash() -> None:
    a, b = Metrics(), Metrics()
    a.engine("m", "0").token_gap(0.5)
    labels = {"model_name": "m", "engine": "0"}
    assert _sample(a, "vllm:inter_token_latency_seconds_count", labels) == 1
    assert _sample(b, "vllm:inter_token_latency_seconds_count", labels) is None
    assert REGISTRY.get_sample_value("vllm:inter_token_latency_seconds_count", labels) is None


def test_a_workers_series_exist_at_zero_from_its_start() -> None:
    m = Metrics()
    m.engine("tiny", "0")
    assert _sample(m, "vllm:num_requests_waiting", TINY) == 0
    assert _sample(m, "vllm:kv_cache_usage_perc", TINY) == 0
    assert _sample(m, "vllm:prompt_tokens_total", TINY) == 0
    assert _sample(m, "vllm:e2e_request_latency_seconds_count", TINY) == 0
    for reason in ("stop", "length", "abort", "error"):
        assert _sample(m, "vllm:request_success_total", {**TINY, "finished_reason": reason}) == 0
    assert m.engine("tiny", "0") is m.engine("tiny", "0")  # bound once


def test_a_finished_request_is_split_into_vllms_phases() -> None:
    m = Metrics()
    stats = m.engine("tiny", "0")
    r = _request(8, 5)
    r.num_cached_tokens = 4
    r.queued_time, r.scheduled_time = 100.5, 101.0
    r.first_token_time, r.last_token_time = 101.25, 103.25
    stats.prefill_done(r)
    stats.request_finished(r, "stop", now=104.0)
    assert _sample(m, "vllm:request_success_total", {**TINY, "finished_reason": "stop"}) == 1
    assert _sample(m, "vllm:prompt_tokens_total", TINY) == 8
    expected = {
        "vllm:time_to_first_token_seconds": 1.25,  # from arrival
        "vllm:e2e_request_latency_seconds": 4.0,
        "vllm:request_queue_time_seconds": 0.5,
        "vllm:request_prefill_time_seconds": 0.25,
        "vllm:request_decode_time_seconds": 2.0,
        "vllm:request_inference_time_seconds": 2.25,
        "vllm:request_time_per_output_token_seconds": 0.5,  # 2 s over the 4 tokens after the first
        "vllm:request_prompt_tokens": 8,
        "vllm:request_generation_tokens": 5,
        "vllm:request_prefill_kv_computed_tokens": 4,
        "vllm:request_params_max_tokens": 100,
        "vllm:request_params_n": 1,
        "vllm:request_max_num_generation_tokens": 5,
    }
    for name, total in expected.items():
        assert (_sample(m, f"{name}_count", TINY), _sample(m, f"{name}_sum", TINY)) == (1, total), name
    # vLLM's buckets: the queue's 0.5 s is in le=0.5, not in le=0.3
    assert _sample(m, "vllm:request_queue_time_seconds_bucket", {**TINY, "le": "0.3"}) == 0
    assert _sample(m, "vllm:request_queue_time_seconds_bucket", {**TINY, "le": "0.5"}) == 1


def test_queue_time_is_split_by_priority_class() -> None:
    m = Metrics()
    stats = m.engine("tiny", "0")
    for priority, wait in ((-1, 0.1), (-5, 0.2), (0, 1.0), (3, 2.0), (3, 4.0)):
        r = _request(8, 0)
        r.sampling_params = SamplingParams(max_tokens=100, priority=priority)
        r.queued_time, r.scheduled_time = 100.0, 100.0 + wait
        stats.request_finished(r, "abort", now=110.0)
    for cls, (count, total) in {"urgent": (2, 0.3), "default": (1, 1.0), "background": (2, 6.0)}.items():
        labels = {**TINY, "priority_class": cls}
        observed = (_sample(m, "omni_request_queue_time_seconds_count", labels),
                    _sample(m, "omni_request_queue_time_seconds_sum", labels))  # fmt: skip
        assert observed == pytest.approx((count, total)), cls
    assert _sample(m, "vllm:request_queue_time_seconds_count", TINY) == 5


def test_an_abort_in_the_queue_has_no_phases_but_its_wait() -> None:
    m = Metrics()
    r = _request(8, 0)
    r.queued_time = 100.0
    m.engine("tiny", "0").request_finished(r, "abort", now=103.0)
    assert _sample(m, "vllm:request_success_total", {**TINY, "finished_reason": "abort"}) == 1
    assert _sample(m, "vllm:e2e_request_latency_seconds_sum", TINY) == 3.0
    for phase in ("queue", "prefill", "decode", "inference"):
        assert _sample(m, f"vllm:request_{phase}_time_seconds_count", TINY) == 0
    assert _sample(m, "vllm:request_time_per_output_token_seconds_count", TINY) == 0
    assert _sample(m, "vllm:request_prefill_kv_computed_tokens_count", TINY) == 0  # it computed nothing


def test_a_prompts_n_and_longest_choice_are_observed_once_when_its_last_choice_ends() -> None:
    m = Metrics()
    stats = m.engine("tiny", "0")
    group = ChoiceGroup(3)
    for num_output in (2, 7, 4):
        stats.request_finished(_request(3, num_output), "length", now=101.0, group=group)
    assert (_sample(m, "vllm:request_params_n_count", TINY), _sample(m, "vllm:request_params_n_sum", TINY)) == (1, 3)
    assert _sample(m, "vllm:request_max_num_generation_tokens_sum", TINY) == 7
    assert _sample(m, "vllm:request_generation_tokens_count", TINY) == 3  # per choice


def test_an_admissions_choices_are_grouped_by_prompt() -> None:
    def choices(prompt: list[int], n: int) -> list[Request]:
        return [Request(RequestId(f"c{i}"), prompt, SamplingParams(max_tokens=4)) for i in range(n)]

    shared = [1, 2, 3]
    chat = choice_groups(choices(shared, 3))
    assert [g.n for g in chat] == [3, 3, 3] and chat[0] is chat[2]
    # a completion of two prompts, n=2 each: prompt-major, each prompt its own group
    two = choice_groups(choices([1, 2], 2) + choices([3, 4], 2))
    assert [g.n for g in two] == [2, 2, 2, 2] and two[0] is two[1] and two[1] is not two[2]
    # an equal prompt with other media is another prompt
    images = [Request(RequestId(f"m{i}"), [9, 9], SamplingParams(max_tokens=4), media=(MediaSpan(0, 2, k),))
              for i, k in enumerate("ab")]  # fmt: skip
    assert [g.n for g in choice_groups(images)] == [1, 1]


def test_the_scheduler_state_and_the_cache_config() -> None:
    m = Metrics()
    stats = m.engine("tiny", "1")
    one = {"model_name": "tiny", "engine": "1"}
    stats.set_scheduler_state(3, 1, 0.25)
    stats.add_prefix_cache(32, 16)
    stats.add_prefix_cache(16, 0)
    stats.add_preemptions("kv_cache", 1)
    stats.add_preemptions("priority", 2)
    stats.add_step(17, 0.004)
    stats.add_step(1, 0.002)
    assert _sample(m, "vllm:num_requests_running", one) == 3
    assert _sample(m, "vllm:num_requests_waiting", one) == 1
    assert _sample(m, "vllm:kv_cache_usage_perc", one) == 0.25
    assert _sample(m, "vllm:prefix_cache_queries_total", one) == 48
    assert _sample(m, "vllm:prefix_cache_hits_total", one) == 16
    assert _sample(m, "vllm:num_preemptions_total", one) == 3  # the sum of the reasons
    assert _sample(m, "omni_preemptions_by_reason_total", {**one, "reason": "kv_cache"}) == 1
    assert _sample(m, "omni_preemptions_by_reason_total", {**one, "reason": "priority"}) == 2
    assert _sample(m, "vllm:iteration_tokens_total_sum", one) == 18
    assert _sample(m, "vllm:iteration_tokens_total_bucket", {**one, "le": "16.0"}) == 1
    assert _sample(m, "omni_engine_step_seconds_count", one) == 2
    stats.set_cache_config(block_size=16, num_gpu_blocks=100, enable_prefix_caching=True)
    stats.set_cache_config(block_size=16, num_gpu_blocks=90, enable_prefix_caching=True)  # restarted smaller
    info = {**one, "block_size": "16", "enable_prefix_caching": "True", "cache_dtype": "auto"}
    assert _sample(m, "vllm:cache_config_info", {**info, "num_gpu_blocks": "90"}) == 1
    assert _sample(m, "vllm:cache_config_info", {**info, "num_gpu_blocks": "100"}) is None


def test_omni_only_series_are_labelled_model_name() -> None:
    m = Metrics()
    m.add_rejected("tiny", "requests")
    m.add_placement("tiny", "1", "prefix")
    m.encoder_cache("tiny", "vision_encoder", hit=True)
    m.add_decoder_jobs("tiny", "ok", 2)
    assert _sample(m, "omni_requests_rejected_total", {"model_name": "tiny", "reason": "requests"}) == 1
    placed = {"model_name": "tiny", "engine": "1", "reason": "prefix"}
    assert _sample(m, "omni_placement_decisions_total", placed) == 1
    assert _sample(m, "omni_encoder_cache_hits_total", {"model_name": "tiny", "component": "vision_encoder"}) == 1
    assert _sample(m, "omni_decoder_jobs_total", {"model_name": "tiny", "outcome": "ok"}) == 2


def test_the_decoders_dit_blocks_count_computed_and_skipped() -> None:
    m = Metrics()
    m.add_decoder_blocks("tiny", 60, 40)
    m.add_decoder_blocks("tiny", 100, 0)
    assert _sample(m, "omni_decoder_dit_blocks_total", {"model_name": "tiny", "outcome": "computed"}) == 160
    assert _sample(m, "omni_decoder_dit_blocks_total", {"model_name": "tiny", "outcome": "skipped"}) == 40


def test_realtime_sessions_and_responses() -> None:
    """A session is a WebSocket connection (vLLM's series); its responses count by status, all
    four present at 0 from the model's first session, and first audio is a histogram per model."""
    m = Metrics()
    m.websocket_opened()
    m.websocket_opened()
    m.websocket_closed(3.0)
    assert _sample(m, "vllm:websocket_connections_active") == 1
    assert _sample(m, "vllm:websocket_connections_total") == 2
    assert _sample(m, "vllm:websocket_connection_duration_seconds_count") == 1
    assert _sample(m, "vllm:websocket_connection_duration_seconds_bucket", {"le": "5.0"}) == 1
    m.realtime_model("tiny")
    for status in ("completed", "cancelled", "failed", "incomplete"):
        assert _sample(m, "omni_realtime_responses_total", {"model_name": "tiny", "status": status}) == 0
    m.add_realtime_response("tiny", "cancelled")
    m.observe_first_audio("tiny", 0.3)
    assert _sample(m, "omni_realtime_responses_total", {"model_name": "tiny", "status": "cancelled"}) == 1
    assert _sample(m, "omni_realtime_first_audio_seconds_bucket", {"model_name": "tiny", "le": "0.25"}) == 0
    assert _sample(m, "omni_realtime_first_audio_seconds_bucket", {"model_name": "tiny", "le": "0.5"}) == 1


def test_vllms_token_buckets() -> None:
    assert one_two_five(100) == (1, 2, 5, 10, 20, 50, 100)
    assert one_two_five(4096)[-1] == 2000


async def test_render_served_by_aiohttp() -> None:
    m = Metrics()
    m.engine("tiny", "0").token_gap(0.02)

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
    assert 'vllm:inter_token_latency_seconds_count{engine="0",model_name="tiny"} 1.0' in text
    assert "# TYPE vllm:inter_token_latency_seconds histogram" in text
    # the process collectors are on this registry too
    assert "# TYPE process_resident_memory_bytes gauge" in text
    assert "python_info{" in text and "python_gc_objects_collected_total{" in text
