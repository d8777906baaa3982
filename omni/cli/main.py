"""`omni-serve`: parse flags, make sure a model exists, run the HTTP server until signalled."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import orjson
from aiohttp import web

from omni.http.access_log import AccessLogger
from omni.shared.log_format import setup_logging
from omni.http.app import STARTUP, create_app
from omni.config import CorsPolicy, EngineConfig, ServerConfig
from omni.cli.config_file import ConfigFileError, apply_config_file
from omni.text.constrained.audio_span import MIN_UNITS
from omni.http.connections import ConnectionLimits, ServerRunner
from omni.cli.vllm_flags import unsupported_flag_message
from omni.shared.media.limits import MediaLimits
from omni.model_layout import ModelLayout
from omni.text.parsers.reasoning import REASONING_PARSERS
from omni.text.parsers.tool_calls import TOOL_PARSERS
from omni.cli.sd_notify import Notifier
from omni.serving.model import ModelRegistry
from omni.http.state import MODELS
from omni.shared.store.spec import StoreSpec
from scheduler.placement import POLICIES, parse_weights

log = logging.getLogger("omni.cli.main")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_FACTORS = {
    **{u: 1 for u in ("", "b")},
    **{p + s: 1000**i for i, p in enumerate("kmgt", 1) for s in ("", "b")},
    **{p + s: 1024**i for i, p in enumerate("kmgt", 1) for s in ("i", "ib")},
}


def parse_size(text: str) -> int:
    """'4GiB' -> 4 * 2**30, '500MB' -> 500 * 10**6, '1024' -> 1024."""
    match = _SIZE.match(text)
    unit = (match.group(2) or "").lower() if match else ""
    if not match or unit not in _FACTORS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4GiB, 512MB)")
    return int(float(match.group(1)) * _FACTORS[unit])


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _string_list(text: str) -> list[str]:
    """A JSON list, as vLLM takes its CORS flags ('["https://a.example"]'), or a comma list."""
    text = text.strip()
    if text.startswith("["):
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not a JSON list: {exc}") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError("must be a JSON list of strings")
        return value
    return [v.strip() for v in text.split(",") if v.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omni-serve",
        description="Serve a model behind an OpenAI-compatible HTTP API. vLLM's flag names are "
        "accepted for the same settings (a positional model, --data-parallel-size, "
        "--gpu-memory-utilization, ...); a vLLM flag with no counterpart is refused by name.",
        # A flag is its whole name: an abbreviation in a config file or a launch script would
        # change meaning when a longer flag is added.
        allow_abbrev=False,
    )
    p.add_argument(
        "model_tag",
        nargs="?",
        metavar="MODEL",
        help="checkpoint directory, as in `vllm serve MODEL` (the same as one --model)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help="YAML file of settings (flag names without the dashes); flags given here win over it",
    )
    p.add_argument(
        "--model",
        metavar="[NAME=]DIR",
        action="append",
        help="Hugging Face checkpoint directory, served as NAME (default: the directory's "
        "name); repeat to serve several models, picked by the request's `model` "
        "(default: a small random model made locally)",
    )
    p.add_argument(
        "--served-model-name",
        nargs="+",
        metavar="NAME",
        help="model name clients send (default: DIR's name); more names are aliases of the first, "
        "which responses carry",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument(
        "--devices",
        help="comma-separated devices for the LLM workers (e.g. cuda:0,cuda:1); "
        "workers are placed on them round-robin",
    )
    p.add_argument(
        "--llm-workers",
        "--data-parallel-size",
        "-dp",
        type=_positive_int,
        dest="llm_workers",
        help="data-parallel LLM worker processes per model (default: one per --devices entry)",
    )
    for flags in (("--tensor-parallel-size", "-tp"), ("--pipeline-parallel-size", "-pp")):
        p.add_argument(
            *flags,
            type=_positive_int,
            default=1,
            help="only 1: each LLM worker holds the whole model (scale with --data-parallel-size)",
        )
    p.add_argument(
        "--placement",
        default="prefix-aware",
        choices=sorted(POLICIES),
        help="how requests are spread over a model's workers",
    )
    p.add_argument(
        "--placement-weights",
        default="",
        metavar="prefix=3,queue=2,kv=2",
        help="weights of the prefix-aware scorers",
    )
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16", "half", "float"])
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--num-kv-blocks", type=int, help="KV cache size in blocks")
    kv.add_argument(
        "--kv-cache-memory", type=parse_size, help="KV cache size in bytes (e.g. 2GiB)"
    )
    kv.add_argument(
        "--gpu-memory-utilization",
        type=_fraction,
        help="fraction of each GPU's memory an LLM worker may use, weights, activations and "
        "whatever else holds that GPU included: the KV cache takes what is left of it "
        "(default on GPU: 85%% of the memory free after loading). Ignored on CPU, where "
        "--kv-cache-memory sizes the cache (default 2GiB)",
    )
    p.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests per step at most")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="tokens per step at most (default 512 on CPU, where smaller prefill chunks "
        "bring first tokens sooner at the same throughput; 8192 on GPU)",
    )
    prefix = p.add_mutually_exclusive_group()
    prefix.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="automatic prefix caching (on by default)",
    )
    prefix.add_argument(
        "--no-prefix-caching", action="store_true", help="disable automatic prefix caching"
    )
    p.add_argument(
        "--seed",
        type=int,
        help="seed of each worker's random generator, for requests without a seed of their own "
        "(default: random)",
    )
    p.add_argument(
        "--max-logprobs",
        type=_positive_int,
        default=20,
        help="the most logprobs (or top_logprobs, prompt_logprobs) a request may ask for (default 20)",
    )
    p.add_argument(
        "--attention-backend", default="auto", choices=["auto", "torch_sdpa", "flash_attn"]
    )
    p.add_argument("--num-threads", type=int, help="torch threads per CPU worker")
    p.add_argument(
        "--api-key",
        default=os.environ.get("OMNI_SERVE_API_KEY"),
        help="require this bearer token (default: $OMNI_SERVE_API_KEY)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=parse_size,
        default=64 * 1024 * 1024,
        help="largest request body (media travel inline as base64; default 64MiB)",
    )
    p.add_argument("--worker-start-timeout", type=float, default=600.0)
    load = p.add_argument_group("admission and deadlines")
    load.add_argument(
        "--max-queued-requests",
        type=_positive_int,
        help="requests that may wait for a model, across its workers; beyond it a 429 "
        "(default: 2 x --max-num-seqs per live worker)",
    )
    load.add_argument(
        "--max-queued-tokens",
        type=_positive_int,
        help="prompt tokens that may wait for a model, across its workers; beyond it a 429 "
        "(default per live worker: 2 x its KV cache's tokens, at least --max-num-seqs "
        "prompts of the full context length)",
    )
    load.add_argument(
        "--request-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="abort a request this long after its prompt is ready (a 504, or an error "
        "event in a stream); a request may ask for less with the X-Request-Timeout header "
        "(default: no deadline)",
    )
    load.add_argument(
        "--max-queued-media-items",
        type=_positive_int,
        help="media items that may wait for a model's encoder; beyond it a 429 (default: 4 batches)",
    )
    load.add_argument(
        "--max-queued-media-bytes",
        type=parse_size,
        help="bytes of media that may wait for a model's encoder; beyond it a 429 "
        "(default: 8 x --max-media-bytes)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=60.0,
        help="seconds in-flight requests get to finish after SIGTERM",
    )
    conn = p.add_argument_group("connections")
    conn.add_argument(
        "--header-timeout",
        type=float,
        default=20.0,
        help="seconds a request's headers may take to arrive; a slower client is cut off",
    )
    conn.add_argument(
        "--body-timeout", type=float, default=60.0, help="seconds a request's body may take to arrive (a 408 after)"
    )
    conn.add_argument(
        "--keepalive-timeout", type=float, default=30.0, help="seconds an idle keep-alive connection stays open"
    )
    conn.add_argument(
        "--max-connections", type=int, default=1024, help="open connections at most; past it a new one gets a 503"
    )
    p.add_argument(
        "--store",
        default="",
        metavar="local:DIR|s3://BUCKET/PREFIX",
        help="artifact store for encoder outputs and generated media "
        "(default: local, under $OMNI_SERVE_CACHE or ~/.cache/omni-serve)",
    )
    p.add_argument(
        "--store-url-base",
        help="public base URL for the local store's signed links (default http://HOST:PORT); "
        "their HMAC key is $OMNI_STORE_SECRET, else random per process",
    )
    p.add_argument("--store-endpoint-url", help="S3 endpoint (MinIO, moto, ...)")
    p.add_argument("--store-region", help="S3 region")
    media = p.add_argument_group("media input")
    media.add_argument(
        "--allow-remote-media",
        action="store_true",
        help="fetch http(s) media URLs (public addresses only); default: data: URLs only",
    )
    defaults = MediaLimits()
    media.add_argument("--max-media-bytes", type=parse_size, default=defaults.max_bytes, help="per item, encoded")
    media.add_argument(
        "--max-image-pixels", type=int, default=defaults.max_image_pixels, help="decoded width x height per image"
    )
    media.add_argument("--max-audio-seconds", type=float, default=defaults.max_audio_seconds)
    media.add_argument(
        "--max-video-frames", type=int, default=defaults.max_video_frames, help="after sampling at --video-fps"
    )
    media.add_argument("--video-fps", type=float, default=defaults.video_fps, help="video frames sampled per second")
    media.add_argument("--max-media-items", type=int, default=defaults.max_items_per_request, help="per request")
    media.add_argument("--media-fetch-timeout", type=float, default=defaults.remote_fetch_timeout_s)
    media.add_argument("--encoder-device", help="device of the encoder worker (default: the first LLM device)")
    p.add_argument(
        "--disable-log-requests",
        action="store_true",
        help="no access log line per request (vLLM's name); by default each request logs its status, "
        "model, tokens, TTFT, latency and X-Request-Id",
    )
    images = p.add_argument_group("image output")
    images.add_argument(
        "--vision-decoder-devices",
        help="devices of the image decoder, comma-separated, one process each: several make one "
        "Ulysses sequence-parallel group (e.g. cuda:2,cuda:3 or cpu,cpu; default: one, on the encoder's device)",
    )
    images.add_argument(
        "--diffusion-steps", type=int, default=25, help="denoising steps per image unless a request asks (default 25)"
    )
    images.add_argument(
        "--max-batch-images", type=int, default=8, help="images drawn together in one batch (default 8)"
    )
    images.add_argument(
        "--max-queued-images",
        type=int,
        help="images that may wait for the decoder; beyond it a 429 (default: 4 batches)",
    )
    speech = p.add_argument_group("audio output")
    speech.add_argument(
        "--audio-decoder-device", help="device of the audio decoder (vocoder) process (default: the encoder's)"
    )
    speech.add_argument(
        "--audio-first-chunk-units",
        type=_positive_int,
        default=4,
        help="units (25 a second) of an audio span sent to the vocoder first, so sound starts early; at "
        "least the span's 3 (default 4: 160 ms)",
    )
    speech.add_argument(
        "--audio-chunk-units", type=_positive_int, default=25, help="units of each later chunk (default 25: 1 s)"
    )
    speech.add_argument(
        "--max-audio-streams",
        type=_positive_int,
        default=256,
        help="answers the vocoder speaks at once; beyond it a request asking for audio is a 429 (default 256)",
    )
    speech.add_argument(
        "--no-audio-output",
        action="store_true",
        help="do not start the checkpoint's audio decoder: the model cannot speak",
    )
    images.add_argument(
        "--no-image-output",
        action="store_true",
        help="do not start the checkpoint's image decoder: the model cannot draw images",
    )
    chat = p.add_argument_group("chat format")
    chat.add_argument(
        "--chat-template",
        metavar="FILE|TEMPLATE",
        help="Jinja chat template (a file, or the template itself) replacing the checkpoint's",
    )
    chat.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="render a request's own `chat_template` (off: such a request is a 400)",
    )
    chat.add_argument(
        "--tool-call-parser",
        default="auto",
        help="how tool calls are read from the output: hermes, hyperclovax, none, or auto "
        "(from the chat template)",
    )
    chat.add_argument(
        "--enable-auto-tool-choice",
        action=argparse.BooleanOptionalAction,
        default=True,
        help='serve tool_choice "auto" (the model decides whether to call); on by default',
    )
    chat.add_argument(
        "--reasoning-parser",
        default="auto",
        help="how <think> reasoning is moved into reasoning_content: think, none, or auto "
        "(from the chat template)",
    )
    http = p.add_argument_group("HTTP: TLS, mounting, browsers")
    http.add_argument("--ssl-keyfile", help="TLS private key (PEM); with --ssl-certfile the server speaks HTTPS")
    http.add_argument("--ssl-certfile", help="TLS certificate chain (PEM)")
    http.add_argument("--ssl-ca-certs", help="CA certificates (PEM) that client certificates are checked against")
    http.add_argument(
        "--ssl-cert-reqs",
        type=int,
        default=0,
        choices=[0, 1, 2],
        help="client certificates: 0 not asked, 1 checked when sent, 2 required (Python's ssl.CERT_*)",
    )
    http.add_argument(
        "--root-path",
        default="",
        help="path prefix a reverse proxy serves the API under (e.g. /omni): requests are "
        "answered with or without it, and generated URLs carry it",
    )
    http.add_argument(
        "--allowed-origins",
        type=_string_list,
        help='browser origins allowed to call the API (CORS), a JSON list or comma-separated: '
        '\'["https://ui.example.com"]\' or "*" (default: none, CORS off)',
    )
    http.add_argument("--allowed-methods", type=_string_list, default=["*"], help="CORS methods (default: all)")
    http.add_argument("--allowed-headers", type=_string_list, default=["*"], help="CORS request headers (default: all)")
    http.add_argument("--allow-credentials", action="store_true", help="CORS: let browsers send credentials")
    logs = p.add_argument_group("logging")
    logs.add_argument("--log-level", default=os.environ.get("OMNI_LOG_LEVEL", "INFO"))
    logs.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get("OMNI_LOG_FORMAT", "text"),
        help="json: one JSON object per line (time, level, logger, message, request_id, ...)",
    )
    logs.add_argument(
        "--disable-log-stats", action="store_true", help="no periodic stats line (vLLM's name)"
    )
    logs.add_argument(
        "--log-stats-interval",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between stats lines: throughput, running and waiting requests, KV usage, "
        "prefix cache hit rate (default 10)",
    )
    compat = p.add_argument_group("vLLM flags that change nothing here (accepted so launch lines run)")
    compat.add_argument(
        "--trust-remote-code", action="store_true", help="no code from a checkpoint is ever run"
    )
    compat.add_argument("--enforce-eager", action="store_true", help="models always run eagerly")
    compat.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="chunked prefill is always on; --no-enable-chunked-prefill is refused",
    )
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Flags (and --config's file) into a namespace; a flag the parser cannot read, a vLLM
    flag without a counterpart above all, exits with status 2 and a message naming it."""
    tokens = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    config_path = _config_path(tokens)
    if config_path is not None:
        try:
            apply_config_file(parser, config_path, tokens)
        except ConfigFileError as exc:
            parser.exit(2, f"omni-serve: {exc}\n")
    args, extra = parser.parse_known_args(tokens)
    problem = unsupported_flag_message(extra)
    if problem is not None:
        parser.exit(2, f"omni-serve: {problem}\n")
    return args


def _config_path(tokens: Sequence[str]) -> Path | None:
    for i, token in enumerate(tokens):
        if token == "--config" and i + 1 < len(tokens):
            return Path(tokens[i + 1]).expanduser()
        if token.startswith("--config="):
            return Path(token.split("=", 1)[1]).expanduser()
    return None


def media_limits_from_args(args: argparse.Namespace) -> MediaLimits:
    limits = MediaLimits(
        max_bytes=args.max_media_bytes,
        max_image_pixels=args.max_image_pixels,
        max_audio_seconds=args.max_audio_seconds,
        max_video_frames=args.max_video_frames,
        video_fps=args.video_fps,
        max_items_per_request=args.max_media_items,
        remote_fetch_timeout_s=args.media_fetch_timeout,
        allow_remote=args.allow_remote_media,
    )
    for name in ("max_bytes", "max_image_pixels", "max_audio_seconds", "max_video_frames", "video_fps"):
        if getattr(limits, name) <= 0:
            raise SystemExit(f"omni-serve: {name} must be positive")
    return limits


def _check_encoder_queue(args: argparse.Namespace, limits: MediaLimits) -> None:
    """The encoder admits a request's items one by one: its queue must hold every item one
    request may bring (an image or audio clip is two items, its continuous and its discrete
    encoding), or a request could be refused by its own items on an idle encoder."""
    items = args.max_queued_media_items
    if items is not None and items < 2 * limits.max_items_per_request:
        raise SystemExit(
            f"omni-serve: --max-queued-media-items must be at least {2 * limits.max_items_per_request} "
            "(two per item of --max-media-items)"
        )
    size = args.max_queued_media_bytes
    if size is not None and size < limits.max_bytes:
        raise SystemExit("omni-serve: --max-queued-media-bytes must be at least --max-media-bytes")


def default_model_dir() -> Path:
    """Make (once) the embedded small random checkpoint, in a child so we never load torch."""
    out = subprocess.run(
        [sys.executable, "-m", "gpu_workers.tiny.checkpoints", "--print-default-dir"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _models(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(served name, directory) per model (the positional one first, then each --model); the
    embedded default when none is given."""
    specs = list(args.model or [])
    if args.model_tag:
        if "model" in getattr(args, "from_config_file", ()):
            specs = []  # the line's positional model replaces the config file's
        specs.insert(0, args.model_tag)
    served = args.served_model_name[0] if args.served_model_name else None
    if not specs:
        return [(served or "omni-tiny", default_model_dir())]
    if served and len(specs) > 1:
        raise SystemExit("omni-serve: --served-model-name needs a single model; use --model NAME=DIR")
    models = []
    for spec in specs:
        name, sep, directory = spec.partition("=")
        model_dir = Path(directory if sep else name).expanduser()
        models.append((served or (name if sep else model_dir.name), model_dir))
    names = [n for n, _ in models]
    if len(set(names)) != len(names):
        raise SystemExit(f"omni-serve: two models share a name: {names}")
    return models


def _chat_template(value: str | None) -> str | None:
    """--chat-template: a file's text, or the template given inline (it has Jinja markup)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    if "{{" in value or "{%" in value:
        return value
    raise SystemExit(f"omni-serve: --chat-template {value!r}: no such file, and not a template")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    devices = tuple(d.strip() for d in args.devices.split(",") if d.strip()) if args.devices else ()
    num_workers = args.llm_workers or max(1, len(devices))
    device = devices[0] if devices else args.device
    on_cpu = all(d == "cpu" for d in devices or (device,))
    try:
        weights = tuple(parse_weights(args.placement_weights).items())
    except ValueError as exc:
        raise SystemExit(f"omni-serve: {exc}") from None
    try:
        StoreSpec.parse(args.store)
    except ValueError as exc:
        raise SystemExit(f"omni-serve: {exc}") from None
    models = _models(args)
    layouts = []
    for _, model_dir in models:
        try:
            layouts.append(ModelLayout.from_dir(model_dir.resolve()))
        except ValueError as exc:
            raise SystemExit(f"omni-serve: {exc}") from None
    num_threads = args.num_threads
    decoder_devices = tuple(d.strip() for d in (args.vision_decoder_devices or "").split(",") if d.strip())
    if args.diffusion_steps < 1 or args.max_batch_images < 1:
        raise SystemExit("omni-serve: --diffusion-steps and --max-batch-images must be at least 1")
    encoders_on_cpu = (args.encoder_device or device) == "cpu"
    if num_threads is None and on_cpu:
        # CPU workers share the machine's cores; more torch threads than cores only thrash
        # (OpenMP threads spin). An omni model's encoder worker is one more CPU worker.
        num_cpu_workers = num_workers * len(models)
        num_cpu_workers += sum(1 for layout in layouts if layout.has_encoders and encoders_on_cpu)
        if not args.no_image_output:
            ranks_on_cpu = sum(d == "cpu" for d in decoder_devices) if decoder_devices else int(encoders_on_cpu)
            num_cpu_workers += ranks_on_cpu * sum(1 for layout in layouts if layout.vision_decoder is not None)
        if not args.no_audio_output and (args.audio_decoder_device or args.encoder_device or device) == "cpu":
            num_cpu_workers += sum(1 for layout in layouts if layout.audio_decoder is not None)
        num_threads = max(1, (os.cpu_count() or 1) // num_cpu_workers)
    dtype = {"half": "float16", "float": "float32"}.get(args.dtype, args.dtype)
    if dtype == "auto":
        dtype = "float32" if on_cpu else "bfloat16"
    limits = media_limits_from_args(args)
    _check_encoder_queue(args, limits)
    _check_vllm_only_flags(args)
    if args.audio_first_chunk_units < MIN_UNITS:
        raise SystemExit(f"omni-serve: --audio-first-chunk-units must be at least {MIN_UNITS} (an audio span's least)")
    if on_cpu and args.gpu_memory_utilization is not None:
        log.info("--gpu-memory-utilization applies to GPUs; on CPU --kv-cache-memory sizes the KV cache")
    chat_template = _chat_template(args.chat_template)
    for flag, name, known in (
        ("--tool-call-parser", args.tool_call_parser, TOOL_PARSERS),
        ("--reasoning-parser", args.reasoning_parser, REASONING_PARSERS),
    ):
        if name not in ("auto", "none") and name not in known:
            raise SystemExit(f"omni-serve: {flag} {name!r}: known are {', '.join(sorted(known))}, auto and none")
    engines = []
    for (model_name, _), layout in zip(models, layouts):
        engines.append(
            EngineConfig(
                model_name=model_name,
                model_dir=layout.llm_dir,
                encoder_dir=layout.root if layout.has_encoders else None,
                encoder_device=args.encoder_device,
                vision_decoder_dir=None if args.no_image_output else layout.vision_decoder,
                vision_decoder_devices=decoder_devices,
                audio_decoder_dir=None if args.no_audio_output else layout.audio_decoder,
                audio_decoder_device=args.audio_decoder_device,
                audio_first_chunk_units=args.audio_first_chunk_units,
                audio_chunk_units=args.audio_chunk_units,
                max_audio_streams=args.max_audio_streams,
                diffusion_steps=args.diffusion_steps,
                decoder_max_batch_images=args.max_batch_images,
                decoder_max_queued_images=args.max_queued_images,
                media_limits=limits,
                store=args.store,
                store_endpoint_url=args.store_endpoint_url,
                store_region=args.store_region,
                device=device,
                dtype=dtype,
                block_size=args.block_size,
                num_kv_blocks=args.num_kv_blocks,
                kv_cache_memory_bytes=args.kv_cache_memory,
                max_model_len=args.max_model_len,
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens or (512 if on_cpu else 8192),
                enable_prefix_caching=not args.no_prefix_caching
                if args.enable_prefix_caching is None
                else args.enable_prefix_caching,
                gpu_memory_utilization=args.gpu_memory_utilization,
                seed=args.seed,
                max_logprobs=args.max_logprobs,
                aliases=tuple(args.served_model_name[1:]) if args.served_model_name else (),
                attention_backend=args.attention_backend,
                num_threads=num_threads,
                worker_start_timeout=args.worker_start_timeout,
                max_queued_requests=args.max_queued_requests,
                max_queued_tokens=args.max_queued_tokens,
                request_timeout=args.request_timeout,
                encoder_max_queued_items=args.max_queued_media_items,
                encoder_max_queued_bytes=args.max_queued_media_bytes,
                num_workers=num_workers,
                devices=devices,
                placement=args.placement,
                placement_weights=weights,
                chat_template=chat_template,
                trust_request_chat_template=args.trust_request_chat_template,
                tool_call_parser=args.tool_call_parser,
                enable_auto_tool_choice=args.enable_auto_tool_choice,
                reasoning_parser=args.reasoning_parser,
            )
        )
    return ServerConfig(
        engines=tuple(engines),
        host=args.host,
        port=args.port,
        max_request_bytes=args.max_request_bytes,
        api_key=args.api_key,
        shutdown_timeout=args.shutdown_timeout,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        keepalive_timeout=args.keepalive_timeout,
        max_connections=args.max_connections,
        disable_log_requests=args.disable_log_requests,
        log_stats_interval=None if args.disable_log_stats else args.log_stats_interval,
        cors=_cors_policy(args),
        ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile,
        ssl_ca_certs=args.ssl_ca_certs,
        ssl_cert_reqs=args.ssl_cert_reqs,
        root_path=_root_path(args.root_path),
        store=args.store,
        store_url_base=args.store_url_base,
        store_secret=os.environ["OMNI_STORE_SECRET"].encode()
        if os.environ.get("OMNI_STORE_SECRET")
        else None,
        store_endpoint_url=args.store_endpoint_url,
        store_region=args.store_region,
    )


def _check_vllm_only_flags(args: argparse.Namespace) -> None:
    for flag, value in (("--tensor-parallel-size", args.tensor_parallel_size), ("--pipeline-parallel-size", args.pipeline_parallel_size)):
        if value != 1:
            raise SystemExit(
                f"omni-serve: {flag} {value}: each LLM worker holds the whole model; serve more "
                "requests with --data-parallel-size"
            )
    if not args.enable_chunked_prefill:
        raise SystemExit("omni-serve: --no-enable-chunked-prefill: prefill is always chunked (--max-num-batched-tokens sizes the chunks)")
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise SystemExit("omni-serve: --ssl-keyfile and --ssl-certfile go together")
    if args.ssl_cert_reqs and not args.ssl_ca_certs:
        raise SystemExit("omni-serve: --ssl-cert-reqs needs --ssl-ca-certs to check client certificates against")
    for flag, value in (("--trust-remote-code", args.trust_remote_code), ("--enforce-eager", args.enforce_eager)):
        if value:
            log.info("%s changes nothing: omni-serve runs no checkpoint code and has no graph capture", flag)


def _cors_policy(args: argparse.Namespace) -> CorsPolicy | None:
    if not args.allowed_origins:
        return None
    for origin in args.allowed_origins:
        if origin != "*" and not re.match(r"^https?://[^/\s]+$", origin):
            raise SystemExit(f"omni-serve: --allowed-origins {origin!r}: an origin is scheme://host[:port], or *")
    return CorsPolicy(
        origins=tuple(args.allowed_origins),
        methods=tuple(m.upper() for m in args.allowed_methods),
        headers=tuple(args.allowed_headers),
        allow_credentials=args.allow_credentials,
    )


def _root_path(value: str) -> str:
    """'/omni/' -> '/omni'; '' stays ''."""
    value = value.strip().rstrip("/")
    if value and not value.startswith("/"):
        raise SystemExit(f"omni-serve: --root-path {value!r} must start with /")
    if any(c in value for c in "?#% "):
        raise SystemExit(f"omni-serve: --root-path {value!r}: a plain path, without query or escapes")
    return value


def ssl_context(config: ServerConfig) -> ssl.SSLContext | None:
    if not config.ssl_certfile:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
        if config.ssl_ca_certs:
            context.load_verify_locations(config.ssl_ca_certs)
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(f"omni-serve: TLS: {exc}") from None
    context.verify_mode = ssl.VerifyMode(config.ssl_cert_reqs)
    return context


class ServingCheck:
    """The watchdog's health rule: every model has at least one ready LLM worker, and its
    encoder and image decoder (if any) are ready. A worker that died is restarted by its
    supervisor, which takes as long as loading it (up to --worker-start-timeout): while the
    rule fails the pings go on for that long after it last held, then stop, and systemd
    restarts the whole server. Before READY=1 (loading) only the loop's liveness counts."""

    def __init__(self, registry: ModelRegistry, grace_s: float) -> None:
        self.registry = registry
        self.grace_s = grace_s
        self.last_ok: float | None = None  # monotonic time the rule last held; None: loading

    def __call__(self) -> bool:
        if self.last_ok is None:
            return True
        now = time.monotonic()
        models = list(self.registry)
        if models and all(
            m.pool.serving
            and (m.media is None or m.media.ready)
            and (m.images is None or m.images.ready)
            and (m.audio is None or m.audio.ready)
            for m in models
        ):
            self.last_ok = now
        return now - self.last_ok <= self.grace_s


def _freeze_startup_heap() -> None:
    """Move what startup made (modules, tokenizers, the app) out of the collector's sight: a
    full collection walks every tracked object holding the GIL, and the hundreds of thousands
    loaded at startup made each one a pause for every request in flight."""
    gc.collect()
    gc.freeze()
    log.info("startup heap frozen: %d objects no longer collected", gc.get_freeze_count())


# How soon a thread holding the GIL (a template rendering, a large body decoding) hands it to
# the event loop when the loop asks: CPython's default is 5 ms, paid at every wake-up of the
# loop while the thread runs, so a short request waited tens of ms behind a 60 MB one.
_SWITCH_INTERVAL_S = 0.001


async def serve(config: ServerConfig, notifier: Notifier | None = None) -> int:
    """Run until SIGINT/SIGTERM; return the process exit code."""
    notifier = notifier or Notifier(None)
    notifier.notify("STATUS=loading workers")
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    app = create_app(config)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts
    # its request and frees its KV blocks at once.
    # shutdown_timeout: on SIGTERM the socket closes at once and in-flight requests get this
    # long to finish before their handlers are cancelled (their requests aborted).
    # The connection limits: header deadline, keep-alive, open connections (omni/http/connections.py).
    limits = ConnectionLimits(config.header_timeout, config.keepalive_timeout, config.max_connections)
    access = None if config.disable_log_requests else logging.getLogger("omni.access")
    runner = ServerRunner(
        app,
        limits,
        handler_cancellation=True,
        access_log=access,
        access_log_class=AccessLogger,
        shutdown_timeout=config.shutdown_timeout,
    )
    try:
        await runner.setup()  # runs the cleanup contexts: workers start loading here
    except (OSError, ValueError) as exc:  # e.g. a model directory without a usable tokenizer
        log.error("could not start: %s", exc)
        return 1
    check = ServingCheck(app[MODELS], max(e.worker_start_timeout for e in config.engines))
    # The ping task lives as long as serve(): through the drain too, which systemd times
    # with TimeoutStopSec but may still watch.
    pings = asyncio.create_task(notifier.ping_watchdog(check), name="sd-watchdog")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    exit_code = 0
    try:
        site = web.TCPSite(runner, config.host, config.port, ssl_context=ssl_context(config))
        await site.start()
        log.info("omni-serve listening on %s", config.base_url)
        startup = app[STARTUP]
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({startup, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if startup.done() and not startup.cancelled() and startup.exception() is not None:
                log.error("could not start: %s", startup.exception())
                exit_code = 1
            else:
                if startup.done():
                    log.info("all workers ready")
                    # start_all() has returned: every worker of every model is ready, so
                    # /health answers 200 from here on.
                    check.last_ok = time.monotonic()
                    _freeze_startup_heap()
                    n = len(app[MODELS])
                    notifier.notify("READY=1", f"STATUS=serving {n} model{'s' if n != 1 else ''}")
                await stopped
        finally:
            stopped.cancel()
    except OSError as exc:  # e.g. the port is taken
        log.error("could not listen on %s:%d: %s", config.host, config.port, exc)
        exit_code = 1
    finally:
        log.info("shutting down")
        notifier.notify("STOPPING=1", "STATUS=draining")
        try:
            await runner.cleanup()
        finally:
            pings.cancel()
            notifier.close()
    return exit_code


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    # Worker processes read these when they set up their own logging.
    os.environ["OMNI_LOG_LEVEL"] = args.log_level
    os.environ["OMNI_LOG_FORMAT"] = args.log_format
    config = config_from_args(args)
    notifier = Notifier.from_env(os.environ)  # before any worker is spawned (they inherit it)
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        code = asyncio.run(serve(config, notifier))
    else:
        code = uvloop.run(serve(config, notifier))
    raise SystemExit(code)


if __name__ == "__main__":
    main()
