"""Frozen configuration for the server and each model engine, built once by the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omni.media.limits import MediaLimits


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
    attention_backend: str = "auto"
    num_threads: int | None = None
    # Data-parallel LLM workers of this model, placed round-robin over `devices` (or all on
    # `device` when that is empty), and how requests are spread over them.
    num_workers: int = 1
    devices: tuple[str, ...] = ()
    placement: str = "prefix-aware"
    placement_weights: tuple[tuple[str, float], ...] = ()
    worker_start_timeout: float = 600.0
    # The artifact store the workers open (the server's --store and its S3 settings).
    store: str = ""
    store_endpoint_url: str | None = None
    store_region: str | None = None
    media_limits: MediaLimits = field(default_factory=MediaLimits)
    # An omni checkpoint's root (its encoder component directories), None for a text LLM.
    encoder_dir: Path | None = None
    encoder_device: str | None = None  # default: the first LLM worker's device
    encoder_max_batch_items: int = 32
    # The chat format (omni/chat_format.py): "auto" parsers follow the chat template.
    chat_template: str | None = None  # replaces the checkpoint's template
    trust_request_chat_template: bool = False
    tool_call_parser: str = "auto"
    enable_auto_tool_choice: bool = True
    reasoning_parser: str = "auto"


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
