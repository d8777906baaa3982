"""Prometheus metrics of one server, in a registry of its own.

No metric lives in prometheus_client's global registry: each app owns a Metrics, so several
apps in one process (tests) never clash and /metrics shows only this server's numbers.
Every series carries the served model's name; scheduler-side series also the llm worker's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from omni.protocol import ForwardTiming
from scheduler.request import Request

# From 1 ms (a cached tiny prompt) to minutes (a long generation or a queue under load).
LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0,
)  # fmt: skip
# Per-token gaps are short; the top buckets catch stalls (preemption, a long prefill).
INTER_TOKEN_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

_MODEL = ["model"]
_WORKER = ["model", "worker"]
_COMPONENT = ["model", "component"]
# Items per encoder forward: one image alone up to a full batch of a busy server.
ENCODER_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DECODER_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "omni_requests",
            "Finished requests by finish reason (stop, length, abort, error).",
            ["model", "finish_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "omni_prompt_tokens", "Prompt tokens of finished requests.", _MODEL, registry=r
        )
        self.generation_tokens = Counter(
            "omni_generation_tokens", "Generated tokens of finished requests.", _MODEL, registry=r
        )
        self.time_to_first_token = Histogram(
            "omni_time_to_first_token_seconds",
            "From arrival to the first generated token.",
            _MODEL,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.inter_token_latency = Histogram(
            "omni_inter_token_latency_seconds",
            "Between consecutive generated tokens of one request.",
            _MODEL,
            buckets=INTER_TOKEN_BUCKETS_S,
            registry=r,
        )
        self.e2e_request_latency = Histogram(
            "omni_e2e_request_latency_seconds",
            "From arrival to the end of the request.",
            _MODEL,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.requests_running = Gauge(
            "omni_requests_running", "Requests in the running batch.", _WORKER, registry=r
        )
        self.requests_waiting = Gauge(
            "omni_requests_waiting", "Requests waiting for admission.", _WORKER, registry=r
        )
        self.kv_cache_usage = Gauge(
            "omni_kv_cache_usage_ratio",
            "Fraction of KV-cache blocks in use (0 to 1).",
            _WORKER,
            registry=r,
        )
        self.prefix_cache_queries = Counter(
            "omni_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            _WORKER,
            registry=r,
        )
        self.prefix_cache_hits = Counter(
            "omni_prefix_cache_hits",
            "Prompt tokens found in the prefix cache.",
            _WORKER,
            registry=r,
        )
        self.computed_tokens = Counter(
            "omni_computed_tokens",
            "Tokens the worker computed (prefill chunks and decodes), prefix-cache hits excluded.",
            _WORKER,
            registry=r,
        )
        self.steps = Counter("omni_engine_steps", "Forward steps run.", _WORKER, registry=r)
        self.step_latency = Histogram(
            "omni_engine_step_seconds",
            "From sending a step to its result arriving (the worker's forward plus the pipe).",
            _WORKER,
            buckets=INTER_TOKEN_BUCKETS_S,
            registry=r,
        )
        self.placements = Counter(
            "omni_placement_decisions",
            "Requests placed on a worker, by the reason that decided it.",
            ["model", "worker", "reason"],
            registry=r,
        )
        self.requests_rejected = Counter(
            "omni_requests_rejected",
            "Requests refused with 429 before any work was queued, by the bound that refused "
            "them: requests or tokens (the model's queue), media_items or media_bytes (the "
            "encoder's, counted per refused item).",
            ["model", "reason"],
            registry=r,
        )
        self.preemptions = Counter(
            "omni_preemptions",
            "Requests preempted for lack of KV-cache blocks.",
            _WORKER,
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
            ["model", "outcome"],
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
        self.decoder_running = Gauge(
            "omni_decoder_images_running", "Images the vision decoder is drawing now.", _MODEL, registry=r
        )

    def request_finished(
        self, model: str, finish_reason: str, request: Request, *, now: float | None = None
    ) -> None:
        """Count a request that ended (any way) and its tokens; now is time.monotonic()."""
        end = time.monotonic() if now is None else now
        self.requests.labels(model, finish_reason).inc()
        self.prompt_tokens.labels(model).inc(request.num_prompt_tokens)
        self.generation_tokens.labels(model).inc(request.num_output_tokens)
        self.e2e_request_latency.labels(model).observe(max(0.0, end - request.arrival_time))

    def observe_ttft(self, model: str, seconds: float) -> None:
        self.time_to_first_token.labels(model).observe(seconds)

    def observe_itl(self, model: str, seconds: float) -> None:
        self.inter_token_latency.labels(model).observe(seconds)

    def set_queue(self, model: str, worker: str, num_running: int, num_waiting: int) -> None:
        self.requests_running.labels(model, worker).set(num_running)
        self.requests_waiting.labels(model, worker).set(num_waiting)

    def set_kv_usage(self, model: str, worker: str, usage: float) -> None:
        self.kv_cache_usage.labels(model, worker).set(usage)

    def add_prefix_cache(self, model: str, worker: str, queried: int, hits: int) -> None:
        """Add token counts since the last call (deltas, not running totals)."""
        self.prefix_cache_queries.labels(model, worker).inc(queried)
        self.prefix_cache_hits.labels(model, worker).inc(hits)

    def add_step(
        self, model: str, worker: str, num_scheduled_tokens: int, seconds: float
    ) -> None:
        self.steps.labels(model, worker).inc()
        self.step_latency.labels(model, worker).observe(seconds)
        self.computed_tokens.labels(model, worker).inc(num_scheduled_tokens)

    def add_placement(self, model: str, worker: str, reason: str) -> None:
        self.placements.labels(model, worker, reason).inc()

    def add_rejected(self, model: str, reason: str) -> None:
        self.requests_rejected.labels(model, reason).inc()

    def add_preemptions(self, model: str, worker: str, n: int = 1) -> None:
        self.preemptions.labels(model, worker).inc(n)

    def encoder_cache(self, model: str, component: str, *, hit: bool) -> None:
        (self.encoder_cache_hits if hit else self.encoder_cache_misses).labels(model, component).inc()

    def observe_encoder_batch(self, model: str, seconds: float, forwards: Sequence[ForwardTiming]) -> None:
        """forwards: one per component forward, as the encoder worker reports them."""
        self.encoder_batch_latency.labels(model).observe(seconds)
        for f in forwards:
            self.encoder_batch_size.labels(model, f.component).observe(f.num_items)
            self.encoder_forward_latency.labels(model, f.component).observe(f.seconds)

    def observe_decoder_batch(self, model: str, num_images: int, seconds: float, step_seconds: float) -> None:
        self.decoder_batch_size.labels(model).observe(num_images)
        self.decoder_batch_latency.labels(model).observe(seconds)
        if step_seconds > 0:
            self.decoder_step_latency.labels(model).observe(step_seconds)

    def add_decoder_jobs(self, model: str, outcome: str, n: int = 1) -> None:
        if n:
            self.decoder_jobs.labels(model, outcome).inc(n)

    def set_decoder_queue(self, model: str, length: int) -> None:
        self.decoder_queue.labels(model).set(length)

    def set_decoder_running(self, model: str, num_images: int) -> None:
        self.decoder_running.labels(model).set(num_images)

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
