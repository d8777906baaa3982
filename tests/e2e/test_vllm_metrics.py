"""Issue 13, acceptance 1: after traffic, /metrics has every vLLM series on the agreed list
(tests/omni/test_vllm_metric_names.py) with its type and the labels model_name and engine,
and the series moved as the traffic flowed."""

from __future__ import annotations

import json
import time
import urllib.request

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import BLOCK_SIZE
from tests.omni.test_vllm_metric_names import ENGINE, VLLM_METRICS

MODEL = "omni-tiny"
WORKER = {"model_name": MODEL, "engine": "0"}
HELLO = [{"role": "user", "content": "Hello there, how are you today?"}]  # greedy, no EOS within 24 tokens

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(base: str) -> tuple[dict[str, tuple[str, list[dict[str, str]]]], Samples]:
    """(name as exposed -> (type, each sample's labels)), and every sample's value."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=120) as r:
        text = r.read().decode()
    families, samples = {}, {}
    for family in text_string_to_metric_families(text):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        families[name] = (family.type, [s.labels for s in family.samples])
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return families, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value on this worker (0 when absent)."""
    return samples.get((name, frozenset({**WORKER, **labels}.items())), 0.0)


def idle(base: str) -> None:
    """Wait (bounded) until no earlier test's request is left on the worker."""
    deadline = time.monotonic() + 120  # a hang guard, not a timing
    while time.monotonic() < deadline:
        _, now = scrape(base)
        if value(now, "vllm:num_requests_running") == 0 and value(now, "vllm:num_requests_waiting") == 0:
            return
        time.sleep(0.1)
    raise TimeoutError("the worker never went idle")


def test_vllms_series_are_there_and_move_with_traffic(server: str) -> None:
    idle(server)
    _, before = scrape(server)
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 4, "temperature": 0}
    pair = httpx.post(f"{server}/v1/chat/completions", json={**body, "n": 2}, timeout=120).json()
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=stream, timeout=120) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    reasons = [c["finish_reason"] for c in pair["choices"]]
    reasons += [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
    families, after = scrape(server)

    for name, kind, labels in VLLM_METRICS:
        if labels[:2] != ENGINE:
            continue
        assert name in families, name
        assert families[name][0] == kind, name
        assert {s["engine"] for s in families[name][1] if s.get("model_name") == MODEL} == {"0"}, name

    prompt = pair["usage"]["prompt_tokens"]  # one prompt, three choices: n=2, then one streamed
    generated = pair["usage"]["completion_tokens"] + chunks[-1]["usage"]["completion_tokens"]

    def delta(sample: str, **labels: str) -> float:
        return value(after, sample, **labels) - value(before, sample, **labels)

    assert delta("vllm:prompt_tokens_total") == 3 * prompt
    assert delta("vllm:generation_tokens_total") == generated == 3 * 4
    assert reasons == ["length"] * 3
    assert delta("vllm:request_success_total", finished_reason="length") == 3
    assert delta("vllm:request_success_total", finished_reason="stop") == 0
    for histogram in (
        "vllm:e2e_request_latency_seconds",
        "vllm:time_to_first_token_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
    ):
        assert delta(f"{histogram}_count") == 3, histogram
    assert delta("vllm:inter_token_latency_seconds_count") == 3 * 3  # 4 tokens: 3 gaps each
    assert delta("vllm:request_prompt_tokens_sum") == 3 * prompt
    assert delta("vllm:request_generation_tokens_sum") == 12
    # n: observed once per prompt, when its last choice ends
    assert (delta("vllm:request_params_n_count"), delta("vllm:request_params_n_sum")) == (2, 3)
    assert delta("vllm:request_params_max_tokens_sum") == 3 * 4
    assert delta("vllm:request_max_num_generation_tokens_sum") == 4 + 4
    assert delta("vllm:iteration_tokens_total_count") > 0
    assert delta("vllm:prefix_cache_queries_total") == 3 * prompt
    # the stream's prompt at least: every whole block but the one its last token is in
    assert delta("vllm:prefix_cache_hits_total") >= (prompt - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert value(after, "vllm:num_requests_running") == 0
    info = {"block_size": str(BLOCK_SIZE), "num_gpu_blocks": "512", "enable_prefix_caching": "True"}
    info["cache_dtype"] = "auto"
    assert value(after, "vllm:cache_config_info", **info) == 1
    assert after[("process_resident_memory_bytes", frozenset())] > 0
    # HTTP metrics, by route template and status (the 3 choices were 2 requests)
    http = {"method": "POST", "handler": "/v1/chat/completions", "status": "2xx"}
    http_before = before.get(("http_requests_total", frozenset(http.items())), 0.0)
    assert after[("http_requests_total", frozenset(http.items()))] - http_before == 2
