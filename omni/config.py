"""Frozen configuration for the server and each model engine, built once by the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omni.engines.admission import QueueLimits
from omni.shared.media.limits import MediaLimits


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_name: str
    model_dir: Path
    device: str = "cpu"
    dtype: str = "float32"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    # On GPU: the share of the device's memory a worker may fill, the KV cache taking what
    # the weights and everything else on the device leave (None: 85% of what is free).
    gpu_memory_utilization: float | None = None
    seed: int | None = None  # of the workers' generators, for requests without their own
    max_logprobs: int = 20  # the most logprobs, top_logprobs or prompt_logprobs a request may ask
    aliases: tuple[str, ...] = ()  # more names clients may send for this model
    attention_backend: str = "auto"
    num_threads: int | None = None
    # Data-parallel LLM workers of this model, placed round-robin over `devices` (or all on
    # `device` when that is empty), and how requests are spread over them.
    num_workers: int = 1
    devices: tuple[str, ...] = ()
    placement: str = "prefix-aware"
    placement_weights: tuple[tuple[str, float], ...] = ()
    worker_start_timeout: float = 600.0
    # Admission (omni/engines/admission.py): the most requests, and prompt tokens, that may wait for
    # this model across its workers; None: derived from each live worker's KV cache and batch.
    max_queued_requests: int | None = None
    max_queued_tokens: int | None = None
    # Seconds from a request's prompt being ready (Request.arrival_time) after which it is
    # aborted; None: no deadline unless the request asks for one (X-Request-Timeout).
    request_timeout: float | None = None
    # The artifact store the workers open (the server's --store and its S3 settings).
    store: str = ""
    store_endpoint_url: str | None = None
    store_region: str | None = None
    media_limits: MediaLimits = field(default_factory=MediaLimits)
    # An omni checkpoint's root (its encoder component directories), None for a text LLM.
    encoder_dir: Path | None = None
    encoder_device: str | None = None  # default: the first LLM worker's device
    encoder_max_batch_items: int = 32
    # Media items, and their bytes, that may wait for the encoder; None: derived from the
    # batch size and the per-item byte limit (omni/engines/encoder.py).
    encoder_max_queued_items: int | None = None
    encoder_max_queued_bytes: int | None = None
    # The image decoder (an omni checkpoint's vision_decoder/, None: no image output): one
    # process per device of vision_decoder_devices, a Ulysses group when there are several
    # (empty: one, on the encoder's device).
    vision_decoder_dir: Path | None = None
    vision_decoder_devices: tuple[str, ...] = ()
    diffusion_steps: int = 25
    decoder_max_batch_images: int = 8
    decoder_max_queued_images: int | None = None  # None: 4 batches
    # The audio decoder (an omni checkpoint's audio_decoder/, None: no audio output): one
    # process on audio_decoder_device (None: the encoder's device).
    audio_decoder_dir: Path | None = None
    audio_decoder_device: str | None = None
    audio_first_chunk_units: int = 4  # units of an audio span's first chunk to the vocoder
    audio_chunk_units: int = 25  # of each later chunk
    audio_max_batch_streams: int = 32  # streams decoded together in one vocoder batch
    max_audio_streams: int = 256  # open streams beyond which a request asking for audio is a 429
    # The chat format (omni/text/chat_format.py): "auto" parsers follow the chat template.
    chat_template: str | None = None  # replaces the checkpoint's template
    trust_request_chat_template: bool = False
    tool_call_parser: str = "auto"
    enable_auto_tool_choice: bool = True
    reasoning_parser: str = "auto"

    def queue_limits(self, shares: Sequence[QueueLimits]) -> QueueLimits:
        """The model's queue limits: each flag that is set, else the sum of the given workers'
        shares (QueueLimits.for_worker)."""
        max_requests = self.max_queued_requests
        max_tokens = self.max_queued_tokens
        return QueueLimits(
            sum(s.max_requests for s in shares) if max_requests is None else max_requests,
            sum(s.max_tokens for s in shares) if max_tokens is None else max_tokens,
        )


@dataclass(frozen=True, slots=True)
class CorsPolicy:
    """Which browser origins may call the API (omni/http/cors.py answers their preflights and marks
    their responses). An origin is "*" (any) or a full "scheme://host[:port]"."""

    origins: tuple[str, ...]
    methods: tuple[str, ...] = ("*",)
    headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    max_age: int = 600  # seconds a browser may cache a preflight's answer


@dataclass(frozen=True, slots=True)
class ServerConfig:
    engines: tuple[EngineConfig, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    max_request_bytes: int = 8 * 1024 * 1024
    api_key: str | None = None
    max_n: int = 16
    shutdown_timeout: float = 60.0
    # The artifact store: "" (local, under the cache root), "local:DIR" or "s3://BUCKET/PREFIX".
    store: str = ""
    store_url_base: str | None = None  # public base of signed local URLs; default http://host:port
    store_secret: bytes | None = None  # HMAC key of local signed URLs; default random per process
    store_endpoint_url: str | None = None
    store_region: str | None = None
    # Connection hygiene (omni/http/connections.py): a request's headers must arrive within
    # header_timeout s of its first byte (of the connection, for its first request), its body
    # within body_timeout s; an idle keep-alive connection closes after keepalive_timeout s;
    # past max_connections open at once, a new connection gets a 503 and is closed.
    header_timeout: float = 20.0
    body_timeout: float = 60.0
    keepalive_timeout: float = 30.0
    max_connections: int = 1024
    disable_log_requests: bool = False  # no access log line per request (omni/http/access_log.py)
    cors: CorsPolicy | None = None  # None: no CORS headers, preflights refused (same-origin only)
    # TLS: both set, the server speaks HTTPS; ssl_ca_certs (with ssl_cert_reqs) verifies clients.
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0  # ssl.CERT_NONE; 2 (CERT_REQUIRED) demands a client certificate
    # The path prefix a reverse proxy serves the API under ("/omni"); "" when at the root.
    root_path: str = ""
    log_stats_interval: float | None = 10.0  # seconds between stats lines; None: none

    @property
    def base_url(self) -> str:
        """Where this server answers, as a client on this host reaches it."""
        scheme = "https" if self.ssl_certfile else "http"
        return f"{scheme}://{self.host}:{self.port}{self.root_path}"
