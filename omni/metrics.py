"""Prometheus metrics of one server, in a registry of its own.

What omni-serve and vLLM have in common carries vLLM's names, types, labels and buckets (its v1
engine's: `vllm:` prefix, labels model_name and engine, the LLM worker's index), so a vLLM
dashboard, an autoscaler on vllm:num_requests_waiting and the inference gateway's endpoint
picker read this server unchanged. What only omni-serve has (encoders, the image decoder, the
artifact store, placement, refusals) is `omni_*`, labelled model_name (and engine where it is
per LLM worker). HTTP requests are counted as prometheus-fastapi-instrumentator counts them
for vLLM (omni/http/metrics_middleware.py), and the process collectors add process_* and python_*.
docs/METRICS.md lists every series.

No metric lives in prometheus_client's global registry: each app owns a Metrics, so several
apps in one process (tests) never clash and /metrics shows only this server's numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    Summary,
    generate_latest,
)

from omni.shared.protocol import ForwardTiming
from scheduler.request import Request
from scheduler.scheduler import PREEMPTION_REASONS, PreemptionReason


def one_two_five(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value: vLLM's buckets of token counts."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


# vLLM's buckets. Its token-count histograms stop at the model's max_model_len; one registry
# here serves several models, whose lengths are known only once their workers are up, so the
# series runs to a million tokens (the top buckets of a short model just stay equal).
TOKEN_COUNT_BUCKETS = one_two_five(1_000_000)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

# omni-serve's own: from 1 ms (a cached tiny prompt) to minutes (a long batch of images).
LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0,
)  # fmt: skip
# A forward step is short; the top buckets catch stalls (a long prefill chunk, a slow device).
STEP_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
# Items per encoder forward: one image alone up to a full batch of a busy server.
ENCODER_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
AUDIO_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
DECODER_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)

# prometheus-fastapi-instrumentator's, which vLLM's HTTP metrics come from.
HTTP_HIGHR_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5,
    5.0, 7.5, 10.0, 30.0, 60.0,
)  # fmt: skip
HTTP_LOWR_BUCKETS_S = (0.1, 0.5, 1.0)
# vLLM's WebSocket connections (vllm/entrypoints/speech_to_text/realtime/metrics.py).
WEBSOCKET_DURATION_BUCKETS_S = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
# A realtime response's status in response.done ("cancelled" also when the socket closed first).
REALTIME_STATUSES = ("completed", "cancelled", "failed", "incomplete")

# vllm:request_success's finished_reason values that omni-serve can give (vLLM's spelling; its
# "repetition" has no counterpart here). A passed deadline is an abort, as vLLM has no other.
FINISHED_REASONS = ("stop", "length", "abort", "error")

# omni_request_queue_time_seconds' classes of --scheduling-policy priority's values (lower first)
PRIORITY_CLASSES = ("urgent", "default", "background")


def priority_class(priority: int) -> str:
    return "urgent" if priority < 0 else "default" if priority == 0 else "background"


_ENGINE = ["model_name", "engine"]
_MODEL = ["model_name"]
_COMPONENT = ["model_name", "component"]
# vllm:cache_config_info's labels: vLLM's CacheConfig fields that omni-serve has, by vLLM's name
# (its cache_dtype "auto": the KV cache has the model's dtype), besides model_name and engine.
CACHE_CONFIG_LABELS = ("block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype")


@dataclass(slots=True)
class ChoiceGroup:
    """The n choices of one prompt. vLLM observes n, and the longest choice's token count, once
    per prompt: when the last of its choices ends."""

    n: int
    max_num_generation_tokens: int = 0
    _pending: int = field(init=False)

    def __post_init__(self) -> None:
        self._pending = self.n

    def end(self, num_generation_tokens: int) -> bool:
        """Count one choice out; True when it was the last."""
        self.max_num_generation_tokens = max(self.max_num_generation_tokens, num_generation_tokens)
        self._pending -= 1
        return self._pending == 0


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # process_* (memory, CPU, fds), python_info and python_gc_*, as vLLM's default
        # registry has them; here on this app's registry.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._engines: dict[tuple[str, str], EngineMetrics] = {}
        self._vllm_metrics()
        self._omni_metrics()
        self._http_metrics()
        self._realtime_metrics()

    # ---- vLLM's names (per LLM worker) ---------------------------------------------------
    def _vllm_metrics(self) -> None:
        r = self.registry
        self.num_requests_running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", _ENGINE, registry=r
        )
        self.num_requests_waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", _ENGINE, registry=r
        )
        self.kv_cache_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", _ENGINE, registry=r
        )
        self.prefix_cache_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            _ENGINE,
            registry=r,
        )
        self.prefix_cache_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", _ENGINE, registry=r
        )
        self.num_preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", _ENGINE, registry=r
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", _ENGINE, registry=r
        )
        # speculative decoding (--speculative-config): a draft is one request's drafts in one step
        self.spec_decode_num_drafts = Counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", _ENGINE, registry=r
        )
        self.spec_decode_num_draft_tokens = Counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", _ENGINE, registry=r
        )
        self.spec_decode_num_accepted_tokens = Counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", _ENGINE, registry=r
        )
        self.spec_decode_num_accepted_tokens_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [*_ENGINE, "position"],
            registry=r,
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", _ENGINE, registry=r
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*_ENGINE, "finished_reason"],
            registry=r,
        )
        self.request_prompt_tokens = Histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            _ENGINE,
            buckets=TOKEN_COUNT_BUCKETS,
            registry=r,
        )
        self.request_generation_tokens = Histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            _ENGINE,
            buckets=TOKEN_COUNT_BUCKETS,
            registry=r,
        )
        self.request_prefill_kv_computed_tokens = Histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            _ENGINE,
            buckets=TOKEN_COUNT_BUCKETS,
            registry=r,
        )
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            _ENGINE,
            buckets=ITERATION_TOKEN_BUCKETS,
            registry=r,
        )
        self.request_max_num_generation_tokens = Histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            _ENGINE,
            buckets=TOKEN_COUNT_BUCKETS,
            registry=r,
        )
        self.request_params_n = Histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", _ENGINE, buckets=N_BUCKETS, registry=r
        )
        self.request_params_max_tokens = Histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            _ENGINE,
            buckets=TOKEN_COUNT_BUCKETS,
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _ENGINE,
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.inter_token_latency = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _ENGINE,
            buckets=TOKEN_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.request_time_per_output_token = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _ENGINE,
            buckets=TOKEN_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.e2e_request_latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _ENGINE,
            buckets=REQUEST_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.request_queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _ENGINE,
            buckets=REQUEST_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.request_inference_time = Histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            _ENGINE,
            buckets=REQUEST_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.request_prefill_time = Histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            _ENGINE,
            buckets=REQUEST_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.request_decode_time = Histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            _ENGINE,
            buckets=REQUEST_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.cache_config_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [*_ENGINE, *CACHE_CONFIG_LABELS],
            registry=r,
        )

    # ---- omni-serve's own ---------------------------------------------------------------
    def _omni_metrics(self) -> None:
        r = self.registry
        self.step_latency = Histogram(
            "omni_engine_step_seconds",
            "From sending a step to its result arriving (the worker's forward plus the pipe).",
            _ENGINE,
            buckets=STEP_BUCKETS_S,
            registry=r,
        )
        self.deadlines_exceeded = Counter(
            "omni_request_deadlines_exceeded",
            "Requests aborted at their deadline (counted among vllm:request_success's aborts too).",
            _ENGINE,
            registry=r,
        )
        self.placements = Counter(
            "omni_placement_decisions",
            "Requests placed on an LLM worker (engine), by the reason that decided it.",
            [*_ENGINE, "reason"],
            registry=r,
        )
        self.preemptions = Counter(
            "omni_preemptions_by_reason",
            "Running requests preempted (recomputed later), by reason: kv_cache (a running request "
            "needed KV blocks) or priority (a more urgent waiting request needed a seat or blocks); "
            "vllm:num_preemptions is their sum.",
            [*_ENGINE, "reason"],
            registry=r,
        )
        self.queue_time_by_priority = Histogram(
            "omni_request_queue_time_seconds",
            "vllm:request_queue_time_seconds by the request's priority class: urgent (< 0), "
            "default (0) or background (> 0).",
            [*_ENGINE, "priority_class"],
            buckets=REQUEST_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.requests_rejected = Counter(
            "omni_requests_rejected",
            "Requests refused with 429 before any work was queued, by the bound that refused "
            "them: requests or tokens (the model's queue), media_items or media_bytes (the "
            "encoder's, counted per refused item), images (the image decoder's).",
            [*_MODEL, "reason"],
            registry=r,
        )

        self.encoder_cache_hits = Counter(
            "omni_encoder_cache_hits",
            "Media items whose encoder output was already in the artifact store.",
            _COMPONENT,
            registry=r,
        )
        self.encoder_cache_misses = Counter(
            "omni_encoder_cache_misses",
            "Media items sent to the encoder (not found in the artifact store).",
            _COMPONENT,
            registry=r,
        )
        self.encoder_batch_size = Histogram(
            "omni_encoder_batch_size",
            "Items encoded together in one encoder forward.",
            _COMPONENT,
            buckets=ENCODER_BATCH_BUCKETS,
            registry=r,
        )
        self.encoder_forward_latency = Histogram(
            "omni_encoder_forward_seconds",
            "One encoder forward over a batch (decode excluded, preprocessing included).",
            _COMPONENT,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.encoder_batch_latency = Histogram(
            "omni_encoder_batch_seconds",
            "From sending an encode batch to its result (decode, forwards, store writes, pipe).",
            _MODEL,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        # The store is the server's, shared by its models: no model_name.
        self.store_latency = Histogram(
            "omni_store_operation_seconds",
            "Artifact store operations by operation (put: one concurrent batch of encoder writes).",
            ["operation"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.store_errors = Counter(
            "omni_store_errors",
            "Artifact store operations that failed (backend errors, not missing keys).",
            ["operation"],
            registry=r,
        )

        self.decoder_jobs = Counter(
            "omni_decoder_jobs",
            "Images drawn by the vision decoder, by outcome (ok, error: bad codes, failed: worker).",
            [*_MODEL, "outcome"],
            registry=r,
        )
        self.decoder_blocks = Counter(
            "omni_decoder_dit_blocks",
            "DiT block computations of the images drawn, every step and guidance pass, by outcome "
            "(computed; skipped: reused by the step cache).",
            [*_MODEL, "outcome"],
            registry=r,
        )
        self.decoder_batch_size = Histogram(
            "omni_decoder_batch_size",
            "Images drawn together, one forward per denoising step for all of them.",
            _MODEL,
            buckets=DECODER_BATCH_BUCKETS,
            registry=r,
        )
        self.decoder_step_latency = Histogram(
            "omni_decoder_step_seconds",
            "One denoising step of a batch (every guidance pass and every rank's share).",
            _MODEL,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.decoder_batch_latency = Histogram(
            "omni_decoder_batch_seconds",
            "From sending a batch of images to the decoder to its result (all steps, VAE, encoding).",
            _MODEL,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.decoder_queue = Gauge(
            "omni_decoder_queue_length", "Images waiting for the vision decoder.", _MODEL, registry=r
        )
        self.audio_chunks = Counter(
            "omni_audio_decoder_chunks",
            "Chunks of units the audio decoder spoke, by outcome (ok, error: refused, failed: worker).",
            [*_MODEL, "outcome"],
            registry=r,
        )
        self.audio_seconds = Counter(
            "omni_audio_decoder_audio_seconds", "Seconds of audio the audio decoder made.", _MODEL, registry=r
        )
        self.audio_batch_size = Histogram(
            "omni_audio_decoder_batch_size",
            "Streams whose chunks one vocoder batch decoded.",
            _MODEL,
            buckets=AUDIO_BATCH_BUCKETS,
            registry=r,
        )
        self.audio_batch_latency = Histogram(
            "omni_audio_decoder_batch_seconds",
            "From sending a batch of chunks to the audio decoder to its samples.",
            _MODEL,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.audio_streams = Gauge(
            "omni_audio_decoder_streams_open", "Audio spans being spoken now.", _MODEL, registry=r
        )
        self.decoder_running = Gauge(
            "omni_decoder_images_running", "Images the vision decoder is drawing now.", _MODEL, registry=r
        )
        # --vision-decoder-replicas: each replica's share of the two families above, and its jobs
        self.replica_jobs = Counter(
            "omni_decoder_replica_jobs",
            "Images drawn by each vision decoder replica, by outcome (ok, error, failed).",
            [*_MODEL, "replica", "outcome"],
            registry=r,
        )
        self.replica_queue = Gauge(
            "omni_decoder_replica_queue_length",
            "Images waiting for each vision decoder replica.",
            [*_MODEL, "replica"],
            registry=r,
        )
        self.replica_running = Gauge(
            "omni_decoder_replica_images_running",
            "Images each vision decoder replica is drawing now.",
            [*_MODEL, "replica"],
            registry=r,
        )
        self._decoder_queues: dict[tuple[str, int], int] = {}
        self._decoder_running: dict[tuple[str, int], int] = {}

    # ---- HTTP, as prometheus-fastapi-instrumentator's defaults name them -----------------
    def _http_metrics(self) -> None:
        r = self.registry
        self.http_requests = Counter(
            "http_requests_total",
            "Total number of requests by method, status and handler.",
            ["method", "status", "handler"],
            registry=r,
        )
        self.http_request_size = Summary(
            "http_request_size_bytes",
            "Content length of incoming requests by handler. Only value of header is respected. "
            "Otherwise ignored. No percentile calculated. ",
            ["handler"],
            registry=r,
        )
        self.http_response_size = Summary(
            "http_response_size_bytes",
            "Content length of outgoing responses by handler. Only value of header is respected. "
            "Otherwise ignored. No percentile calculated. ",
            ["handler"],
            registry=r,
        )
        self.http_duration_highr = Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate "
            "percentile calculations. ",
            buckets=HTTP_HIGHR_BUCKETS_S,
            registry=r,
        )
        self.http_duration = Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by "
            "handler is important. ",
            ["method", "handler"],
            buckets=HTTP_LOWR_BUCKETS_S,
            registry=r,
        )

    # ---- the Realtime API: vLLM's WebSocket series, and omni's per response ----------------
    def _realtime_metrics(self) -> None:
        r = self.registry
        self.websocket_active = Gauge(
            "vllm:websocket_connections_active", "Number of currently active WebSocket connections.", registry=r
        )
        self.websocket_total = Counter(
            "vllm:websocket_connections_total", "Total number of WebSocket connections.", registry=r
        )
        self.websocket_duration = Histogram(
            "vllm:websocket_connection_duration_seconds",
            "Duration of WebSocket connections in seconds.",
            buckets=WEBSOCKET_DURATION_BUCKETS_S,
            registry=r,
        )
        self.realtime_responses = Counter(
            "omni_realtime_responses",
            "Realtime API responses that ended, by their response.done status: completed, "
            "incomplete, failed (refused by admission control, a passed deadline, an engine's "
            "failure), cancelled (response.cancel, barge-in, or the socket closing).",
            [*_MODEL, "status"],
            registry=r,
        )
        self.realtime_first_audio = Histogram(
            "omni_realtime_first_audio_seconds",
            "From the turn's end (server VAD's speech_stopped, the idle timeout, or the client's "
            "response.create) to the response's first output_audio.delta.",
            _MODEL,
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )

    def websocket_opened(self) -> None:
        self.websocket_active.inc()
        self.websocket_total.inc()

    def websocket_closed(self, seconds: float) -> None:
        self.websocket_active.dec()
        self.websocket_duration.observe(seconds)

    def realtime_model(self, model_name: str) -> None:
        """A realtime model's response series, present at 0 from its first session."""
        for status in REALTIME_STATUSES:
            self.realtime_responses.labels(model_name, status)
        self.realtime_first_audio.labels(model_name)

    def add_realtime_response(self, model_name: str, status: str) -> None:
        self.realtime_responses.labels(model_name, status).inc()

    def observe_first_audio(self, model_name: str, seconds: float) -> None:
        self.realtime_first_audio.labels(model_name).observe(seconds)

    # ---- recording -----------------------------------------------------------------------
    def engine(self, model_name: str, engine: str) -> EngineMetrics:
        """One LLM worker's series (engine: its index), all of them present from now on."""
        key = (model_name, engine)
        if key not in self._engines:
            self._engines[key] = EngineMetrics(self, model_name, engine)
        return self._engines[key]

    def observe_http(
        self, handler: str, method: str, status: int, seconds: float, request_bytes: int, response_bytes: int
    ) -> None:
        group = f"{status // 100}xx"  # the instrumentator's grouping: 2xx, 4xx, 5xx
        self.http_requests.labels(method, group, handler).inc()
        self.http_request_size.labels(handler).observe(request_bytes)
        self.http_response_size.labels(handler).observe(response_bytes)
        self.http_duration_highr.observe(seconds)
        self.http_duration.labels(method, handler).observe(seconds)

    def add_placement(self, model_name: str, engine: str, reason: str) -> None:
        self.placements.labels(model_name, engine, reason).inc()

    def add_rejected(self, model_name: str, reason: str) -> None:
        self.requests_rejected.labels(model_name, reason).inc()

    def encoder_cache(self, model_name: str, component: str, *, hit: bool) -> None:
        (self.encoder_cache_hits if hit else self.encoder_cache_misses).labels(model_name, component).inc()

    def observe_encoder_batch(self, model_name: str, seconds: float, forwards: Sequence[ForwardTiming]) -> None:
        """forwards: one per component forward, as the encoder worker reports them."""
        self.encoder_batch_latency.labels(model_name).observe(seconds)
        for f in forwards:
            self.encoder_batch_size.labels(model_name, f.component).observe(f.num_items)
            self.encoder_forward_latency.labels(model_name, f.component).observe(f.seconds)

    def observe_decoder_batch(self, model_name: str, num_images: int, seconds: float, step_seconds: float) -> None:
        self.decoder_batch_size.labels(model_name).observe(num_images)
        self.decoder_batch_latency.labels(model_name).observe(seconds)
        if step_seconds > 0:
            self.decoder_step_latency.labels(model_name).observe(step_seconds)

    def add_decoder_blocks(self, model_name: str, computed: int, skipped: int) -> None:
        self.decoder_blocks.labels(model_name, "computed").inc(computed)
        self.decoder_blocks.labels(model_name, "skipped").inc(skipped)

    def add_decoder_jobs(self, model_name: str, outcome: str, n: int = 1, *, replica: int = 0) -> None:
        if n:
            self.decoder_jobs.labels(model_name, outcome).inc(n)
            self.replica_jobs.labels(model_name, str(replica), outcome).inc(n)

    def set_decoder_queue(self, model_name: str, length: int, *, replica: int = 0) -> None:
        """One replica's queue; the model's gauge is the sum over its replicas."""
        self.replica_queue.labels(model_name, str(replica)).set(length)
        self.decoder_queue.labels(model_name).set(_set_share(self._decoder_queues, model_name, replica, length))

    def observe_audio_batch(self, model_name: str, num_streams: int, seconds: float, audio_seconds: float) -> None:
        self.audio_batch_size.labels(model_name).observe(num_streams)
        self.audio_batch_latency.labels(model_name).observe(seconds)
        self.audio_seconds.labels(model_name).inc(audio_seconds)

    def add_audio_chunks(self, model_name: str, outcome: str, n: int = 1) -> None:
        if n:
            self.audio_chunks.labels(model_name, outcome).inc(n)

    def set_audio_streams(self, model_name: str, n: int) -> None:
        self.audio_streams.labels(model_name).set(n)

    def set_decoder_running(self, model_name: str, num_images: int, *, replica: int = 0) -> None:
        self.replica_running.labels(model_name, str(replica)).set(num_images)
        self.decoder_running.labels(model_name).set(_set_share(self._decoder_running, model_name, replica, num_images))

    def observe_store(self, operation: str, seconds: float, *, failed: bool = False) -> None:
        self.store_latency.labels(operation).observe(seconds)
        if failed:
            self.store_errors.labels(operation).inc()

    def add_store_errors(self, operation: str, n: int) -> None:
        if n:
            self.store_errors.labels(operation).inc(n)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type (with charset: set it as a header)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class EngineMetrics:
    """One LLM worker's vLLM series, bound to its labels once. Each exists (at 0) from the
    worker's start, as vLLM's do, so a dashboard or a gateway sees an idle worker too.

    A request's times (Request.arrival_time, queued_time, scheduled_time, first_token_time,
    last_token_time; the engine sets them) give its intervals as vLLM computes them:

        arrival   queued     scheduled     first token          last token   end
           |--------|-----------|-------------|--------------------|----------|
                    |   queue   |   prefill   |       decode       |
                                |-------- inference ---------------|
           |----------- TTFT -----------------|
           |------------------------------- e2e ------------------------------|

    A preemption counts inside the phase it interrupts (the first scheduling is the one kept).
    """

    def __init__(self, m: Metrics, model_name: str, engine: str) -> None:
        self._metrics = m
        self.labels = (model_name, engine)
        labels = self.labels
        self.num_requests_running = m.num_requests_running.labels(*labels)
        self.num_requests_waiting = m.num_requests_waiting.labels(*labels)
        self.kv_cache_usage = m.kv_cache_usage.labels(*labels)
        self.prefix_cache_queries = m.prefix_cache_queries.labels(*labels)
        self.prefix_cache_hits = m.prefix_cache_hits.labels(*labels)
        self.num_preemptions = m.num_preemptions.labels(*labels)
        self.preemptions = {reason: m.preemptions.labels(*labels, reason) for reason in PREEMPTION_REASONS}
        self.queue_time_by_priority = {c: m.queue_time_by_priority.labels(*labels, c) for c in PRIORITY_CLASSES}
        self.prompt_tokens = m.prompt_tokens.labels(*labels)
        self.generation_tokens = m.generation_tokens.labels(*labels)
        self.request_success = {reason: m.request_success.labels(*labels, reason) for reason in FINISHED_REASONS}
        self.request_prompt_tokens = m.request_prompt_tokens.labels(*labels)
        self.request_generation_tokens = m.request_generation_tokens.labels(*labels)
        self.request_prefill_kv_computed_tokens = m.request_prefill_kv_computed_tokens.labels(*labels)
        self.iteration_tokens = m.iteration_tokens.labels(*labels)
        self.request_max_num_generation_tokens = m.request_max_num_generation_tokens.labels(*labels)
        self.request_params_n = m.request_params_n.labels(*labels)
        self.request_params_max_tokens = m.request_params_max_tokens.labels(*labels)
        self.time_to_first_token = m.time_to_first_token.labels(*labels)
        self.inter_token_latency = m.inter_token_latency.labels(*labels)
        self.request_time_per_output_token = m.request_time_per_output_token.labels(*labels)
        self.e2e_request_latency = m.e2e_request_latency.labels(*labels)
        self.request_queue_time = m.request_queue_time.labels(*labels)
        self.request_inference_time = m.request_inference_time.labels(*labels)
        self.request_prefill_time = m.request_prefill_time.labels(*labels)
        self.request_decode_time = m.request_decode_time.labels(*labels)
        self.step_latency = m.step_latency.labels(*labels)
        self.deadlines_exceeded = m.deadlines_exceeded.labels(*labels)
        self.spec_decode_num_drafts = m.spec_decode_num_drafts.labels(*labels)
        self.spec_decode_num_draft_tokens = m.spec_decode_num_draft_tokens.labels(*labels)
        self.spec_decode_num_accepted_tokens = m.spec_decode_num_accepted_tokens.labels(*labels)
        self._accepted_per_pos: list[Any] = []  # by draft position, once speculation is configured
        self._cache_config: tuple[str, ...] | None = None

    def set_speculative_tokens(self, num_tokens: int) -> None:
        """Speculation drafts up to num_tokens a step: each position's accepted series, at 0."""
        family = self._metrics.spec_decode_num_accepted_tokens_per_pos
        self._accepted_per_pos = [family.labels(*self.labels, str(p)) for p in range(num_tokens)]

    def add_drafts(self, num_drafts: int, num_accepted: int) -> None:
        """One request verified num_drafts draft tokens in a step and kept the first num_accepted."""
        self.spec_decode_num_drafts.inc()
        self.spec_decode_num_draft_tokens.inc(num_drafts)
        self.spec_decode_num_accepted_tokens.inc(num_accepted)
        for counter in self._accepted_per_pos[:num_accepted]:
            counter.inc()

    def set_cache_config(self, *, block_size: int, num_gpu_blocks: int, enable_prefix_caching: bool) -> None:
        """vllm:cache_config_info: 1, its labels the KV cache this worker allocated (once
        ready; a restarted worker may have sized a different one)."""
        info = self._metrics.cache_config_info
        if self._cache_config is not None:
            info.remove(*self.labels, *self._cache_config)
        self._cache_config = (str(block_size), str(num_gpu_blocks), str(enable_prefix_caching), "auto")
        info.labels(*self.labels, *self._cache_config).set(1)

    def set_scheduler_state(self, num_running: int, num_waiting: int, kv_usage: float) -> None:
        self.num_requests_running.set(num_running)
        self.num_requests_waiting.set(num_waiting)
        self.kv_cache_usage.set(kv_usage)

    def add_preemptions(self, reason: PreemptionReason, n: int) -> None:
        """n more preemptions for this reason (vllm:num_preemptions counts them too)."""
        self.num_preemptions.inc(n)
        self.preemptions[reason].inc(n)

    def add_prefix_cache(self, queried: int, hits: int) -> None:
        """Token counts since the last call (deltas, not running totals)."""
        self.prefix_cache_queries.inc(queried)
        self.prefix_cache_hits.inc(hits)

    def add_step(self, num_scheduled_tokens: int, seconds: float) -> None:
        """One engine step: the tokens it computed (prefill chunks and decodes, prefix-cache
        hits excluded), and how long it took."""
        self.iteration_tokens.observe(num_scheduled_tokens)
        self.step_latency.observe(seconds)

    def prefill_done(self, request: Request) -> None:
        """The request's prompt is computed: its first token is out (or, prefill-only, it ends
        with none). Set request.first_token_time first, if a token came."""
        self.prompt_tokens.inc(request.num_prompt_tokens)
        if request.first_token_time is not None:
            self.time_to_first_token.observe(max(0.0, request.first_token_time - request.arrival_time))

    def token_gap(self, seconds: float) -> None:
        """Between a request's consecutive tokens."""
        self.inter_token_latency.observe(seconds)

    def request_finished(
        self, request: Request, finished_reason: str, now: float, group: ChoiceGroup | None = None
    ) -> None:
        """A request ended, however it ended; now is time.monotonic(). group: its prompt's
        choices, if it was admitted with them (None: it was alone, n = 1)."""
        self.request_success[finished_reason].inc()
        self.e2e_request_latency.observe(max(0.0, now - request.arrival_time))
        num_generation_tokens = request.num_output_tokens
        self.request_prompt_tokens.observe(request.num_prompt_tokens)
        self.request_generation_tokens.observe(num_generation_tokens)
        if request.scheduled_time is not None:
            self.request_prefill_kv_computed_tokens.observe(request.num_prompt_tokens - request.num_cached_tokens)
        if request.sampling_params.max_tokens:
            self.request_params_max_tokens.observe(request.sampling_params.max_tokens)
        if group is None:
            self.request_params_n.observe(1)
            self.request_max_num_generation_tokens.observe(num_generation_tokens)
        elif group.end(num_generation_tokens):
            self.request_params_n.observe(group.n)
            self.request_max_num_generation_tokens.observe(group.max_num_generation_tokens)
        self._observe_phases(request)

    def _observe_phases(self, request: Request) -> None:
        """Each interval whose ends both happened (an abort in the queue has no prefill)."""
        queued, scheduled = request.queued_time, request.scheduled_time
        first, last = request.first_token_time, request.last_token_time
        if queued is not None and scheduled is not None:
            self.request_queue_time.observe(max(0.0, scheduled - queued))
            self.queue_time_by_priority[priority_class(request.priority)].observe(max(0.0, scheduled - queued))
        if scheduled is not None and first is not None:
            self.request_prefill_time.observe(max(0.0, first - scheduled))
        if first is not None and last is not None:
            decode = max(0.0, last - first)
            self.request_decode_time.observe(decode)
            if scheduled is not None:
                self.request_inference_time.observe(max(0.0, last - scheduled))
            # The first token is the prefill's: the decode made the rest. vLLM observes 0 for a
            # request of one token; here it is not observed (0 would pull the mean down).
            if request.num_output_tokens > 1:
                self.request_time_per_output_token.observe(decode / (request.num_output_tokens - 1))


def _set_share(shares: dict[tuple[str, int], int], model_name: str, replica: int, value: int) -> int:
    """Record one replica's value; the model's total over its replicas."""
    shares[model_name, replica] = value
    return sum(v for (name, _), v in shares.items() if name == model_name)
