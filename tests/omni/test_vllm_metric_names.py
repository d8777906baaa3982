"""The agreed list: every series a vLLM dashboard, autoscaler or the inference gateway reads,
with vLLM's (v1 engine's) name, type and labels, present in a fresh server's registry.

Taken from vLLM's vllm/v1/metrics/loggers.py (PrometheusStatLogger) and, for HTTP, from
prometheus-fastapi-instrumentator's default metrics, which vLLM mounts, and for WebSocket
connections (realtime sessions) from vllm/entrypoints/speech_to_text/realtime/metrics.py. Names are as exposed
(a counter's _total included). docs/METRICS.md is the same table for people."""

from __future__ import annotations

from prometheus_client import Metric

from omni.metrics import Metrics

ENGINE = ("model_name", "engine")

VLLM_METRICS: list[tuple[str, str, tuple[str, ...]]] = [
    # scheduler state: what the endpoint picker and a KEDA/HPA rule score on
    ("vllm:num_requests_running", "gauge", ENGINE),
    ("vllm:num_requests_waiting", "gauge", ENGINE),
    ("vllm:kv_cache_usage_perc", "gauge", ENGINE),
    ("vllm:prefix_cache_queries_total", "counter", ENGINE),
    ("vllm:prefix_cache_hits_total", "counter", ENGINE),
    ("vllm:num_preemptions_total", "counter", ENGINE),
    # tokens and requests
    ("vllm:prompt_tokens_total", "counter", ENGINE),
    ("vllm:generation_tokens_total", "counter", ENGINE),
    ("vllm:request_success_total", "counter", (*ENGINE, "finished_reason")),
    ("vllm:request_prompt_tokens", "histogram", ENGINE),
    ("vllm:request_generation_tokens", "histogram", ENGINE),
    ("vllm:request_prefill_kv_computed_tokens", "histogram", ENGINE),
    ("vllm:request_params_n", "histogram", ENGINE),
    ("vllm:request_params_max_tokens", "histogram", ENGINE),
    ("vllm:request_max_num_generation_tokens", "histogram", ENGINE),
    ("vllm:iteration_tokens_total", "histogram", ENGINE),
    # latencies
    ("vllm:time_to_first_token_seconds", "histogram", ENGINE),
    ("vllm:inter_token_latency_seconds", "histogram", ENGINE),
    ("vllm:request_time_per_output_token_seconds", "histogram", ENGINE),
    ("vllm:e2e_request_latency_seconds", "histogram", ENGINE),
    ("vllm:request_queue_time_seconds", "histogram", ENGINE),
    ("vllm:request_inference_time_seconds", "histogram", ENGINE),
    ("vllm:request_prefill_time_seconds", "histogram", ENGINE),
    ("vllm:request_decode_time_seconds", "histogram", ENGINE),
    # vLLM's labels are engine and its CacheConfig's fields; model_name is added here, as one
    # omni-serve serves several models
    (
        "vllm:cache_config_info",
        "gauge",
        (*ENGINE, "block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype"),
    ),
    # HTTP, as prometheus-fastapi-instrumentator's defaults
    ("http_requests_total", "counter", ("method", "status", "handler")),
    ("http_request_duration_seconds", "histogram", ("method", "handler")),
    ("http_request_duration_highr_seconds", "histogram", ()),
    ("http_request_size_bytes", "summary", ("handler",)),
    ("http_response_size_bytes", "summary", ("handler",)),
    # WebSocket connections: vLLM's realtime endpoint's middleware, unlabelled
    ("vllm:websocket_connections_active", "gauge", ()),
    ("vllm:websocket_connections_total", "counter", ()),
    ("vllm:websocket_connection_duration_seconds", "histogram", ()),
    # prometheus_client's process and platform collectors
    ("process_resident_memory_bytes", "gauge", ()),
    ("process_cpu_seconds_total", "counter", ()),
    ("process_open_fds", "gauge", ()),
    ("python_info", "gauge", ("implementation", "major", "minor", "patchlevel", "version")),
    ("python_gc_objects_collected_total", "counter", ("generation",)),
]

# Deprecated in vLLM 0.11 (vllm:inter_token_latency_seconds replaced it) and hidden since: not
# exported, so no dashboard sees the same gaps twice under two names.
VLLM_RETIRED = ["vllm:time_per_output_token_seconds", "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries"]

_SUFFIX_LABELS = {"le", "quantile"}


def _exposed_name(family: Metric) -> str:
    return f"{family.name}_total" if family.type == "counter" else family.name


def _families(m: Metrics) -> dict[str, Metric]:
    return {_exposed_name(f): f for f in m.registry.collect()}


def _fresh() -> Metrics:
    """A server's registry once one LLM worker is up and one HTTP request was answered."""
    m = Metrics()
    stats = m.engine("tiny", "0")
    stats.set_cache_config(block_size=16, num_gpu_blocks=512, enable_prefix_caching=True)
    m.observe_http("/v1/chat/completions", "POST", 200, 0.01, 10, 20)
    return m


def test_every_listed_metric_has_vllms_type_and_labels() -> None:
    families = _families(_fresh())
    for name, kind, labels in VLLM_METRICS:
        assert name in families, name
        family = families[name]
        assert family.type == kind, name
        assert family.samples, name  # present before any traffic, as vLLM's are
        for sample in family.samples:
            assert set(sample.labels) - _SUFFIX_LABELS == set(labels), (name, sample.labels)


def test_the_workers_series_carry_its_model_and_index() -> None:
    families = _families(_fresh())
    for name, _, labels in VLLM_METRICS:
        if labels[:2] == ENGINE:
            assert {(s.labels["model_name"], s.labels["engine"]) for s in families[name].samples} == {("tiny", "0")}


def test_no_series_is_exported_twice_under_an_omni_name() -> None:
    families = _families(_fresh())
    assert not set(VLLM_RETIRED) & families.keys()
    omni = {n for n in families if n.startswith("omni_")}
    # the concepts vLLM names are vLLM's alone; what is left under omni_ is omni-serve's own
    duplicates = (
        "requests_running", "requests_waiting", "kv_cache", "prompt_tokens", "generation_tokens",
        "time_to_first_token", "inter_token", "e2e", "prefix_cache", "preemptions", "computed_tokens",
    )  # fmt: skip
    splits = {"omni_preemptions_by_reason_total"}  # a vLLM series split by a label vLLM lacks (their sum is vLLM's)
    for duplicate in duplicates:
        assert not [n for n in omni - splits if duplicate in n], duplicate
    assert "omni_requests_total" not in omni
