"""Frozen configuration, one dataclass per component, each with only the fields it uses.

Every field that a flag sets declares that flag here, once, with its default and help
(omni/shared/settings.py); omni/cli/flags.py builds the command line and reads `--config`
files from these declarations. The CLI fills a ModelConfig per served model and the
ServerConfig that holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omni.shared.media.limits import MediaLimits
from omni.shared.settings import setting
from omni.shared.speculative import SpeculativeConfig
from scheduler.placement import POLICIES


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What every worker process of a model is started with."""

    dtype: str = setting(
        "float32",
        unset="auto",  # float32 on CPU, else bfloat16
        choices=("auto", "float32", "bfloat16", "float16", "half", "float"),
    )
    # Per component, over --dtype: "vocoder=float32,vae=bfloat16" (omni/engines/worker_specs.py
    # component_dtype says what each takes when not named here)
    component_dtype: tuple[str, ...] = setting(
        (),
        type="devices",
        help="dtype of one component, over --dtype: NAME=DTYPE, comma-separated; NAME is llm, encoder, "
        "vision_decoder, vae or vocoder (default: float32 on CPU and for the vocoder, --dtype otherwise)",
    )
    # --dtype as given: None for auto (float32 on CPU, bfloat16 on a GPU, per component)
    requested_dtype: str | None = None
    # torch threads of each CPU worker (None: torch's default; on CPU the CLI shares the cores)
    num_threads: int | None = setting(None, help="torch threads per CPU worker")
    seed: int | None = setting(
        None,
        help="seed of each worker's random generator, for requests without a seed of their own (default: random)",
    )
    worker_start_timeout: float = setting(600.0)


@dataclass(frozen=True, slots=True)
class LLMConfig:
    """A model's LLM workers, their KV caches and schedulers, and how requests are spread over
    them: num_workers data-parallel workers placed round-robin over `devices` (or all on
    `device` when that is empty)."""

    # The flag's default, auto, is resolved by the CLI (omni/cli/devices.py): cuda:0 when a
    # GPU is visible, else cpu; a config built in code runs on the CPU.
    device: str = setting(
        "cpu", unset="auto", help="auto (default: cuda:0 when a GPU is visible, else cpu), cpu, cuda (cuda:0) or cuda:N"
    )
    devices: tuple[str, ...] = setting(
        (),
        type="devices",
        help="comma-separated devices for the LLM workers (e.g. cuda:0,cuda:1); workers are placed on them round-robin",
    )
    num_workers: int = setting(
        1,
        unset=None,  # one per --devices entry
        flag="--llm-workers",
        vllm_alias=("--data-parallel-size", "-dp"),
        type="positive_int",
        help="data-parallel LLM worker processes per model (default: one per --devices entry)",
    )
    placement: str = setting(
        "prefix-aware", choices=tuple(sorted(POLICIES)), help="how requests are spread over a model's workers"
    )
    # name=weight pairs, read by scheduler.placement.parse_weights
    placement_weights: str = setting("", metavar="prefix=3,queue=2,kv=2", help="weights of the prefix-aware scorers")
    block_size: int = setting(16, help="tokens per KV block")
    num_kv_blocks: int | None = setting(None, exclusive="kv", help="KV cache size in blocks")
    kv_cache_memory_bytes: int | None = setting(
        None, flag="--kv-cache-memory", type="size", exclusive="kv", help="KV cache size in bytes (e.g. 2GiB)"
    )
    # On GPU: the share of the device's memory a worker may fill, the KV cache taking what
    # the weights and everything else on the device leave (None: 85% of what is free).
    gpu_memory_utilization: float | None = setting(
        None,
        type="fraction",
        exclusive="kv",
        help="fraction of each GPU's memory an LLM worker may use, weights, activations and "
        "whatever else holds that GPU included: the KV cache takes what is left of it "
        "(default on GPU: 85%% of the memory free after loading). Ignored on CPU, where "
        "--kv-cache-memory sizes the cache (default 2GiB)",
    )
    max_model_len: int | None = setting(None, help="context length (default: the model's)")
    max_num_seqs: int = setting(64, help="requests per step at most")
    scheduling_policy: str = setting(
        "fcfs",
        choices=("fcfs", "priority"),
        help="fcfs: requests are served in arrival order, and a request's priority must be 0; priority: by "
        "the request's priority, lower first (ties in arrival order), preempting the least urgent running "
        "request when the batch or KV cache has no room for a more urgent one, and shedding the least urgent "
        "waiting one (429) when the queue is full (vLLM's)",
    )
    voice_priority: int = setting(
        -1,
        help="under --scheduling-policy priority, the priority of Realtime responses and of /v1/audio/speech "
        "requests that send none (lower first; a request's own priority field wins): more urgent than the "
        "text default 0, so a voice turn is not kept waiting behind batch work",
    )
    max_num_batched_tokens: int = setting(
        2048,
        unset=None,
        help="tokens per step at most (default 512 on CPU, where smaller prefill chunks "
        "bring first tokens sooner at the same throughput; 8192 on GPU)",
    )
    enable_prefix_caching: bool = setting(
        True,
        unset=None,  # either flag given with the other is refused
        help="automatic prefix caching (on by default)",
        off_flag=("--no-prefix-caching", "disable automatic prefix caching"),
    )
    attention_backend: str = setting(
        "auto",
        choices=("auto", "torch_sdpa", "vllm_flash_attn", "flash_attn", "flashinfer", "flex_paged"),
        help="auto: on CUDA the first paged kernel installed that takes the cache: vllm_flash_attn "
        "(vLLM's flash-attn, blocks of 16n), flash_attn (blocks of 256n), flashinfer (any block; "
        "bin/setup gpu installs it); else torch_sdpa (copies the decode batch's padded context "
        "every layer); flex_paged: decodes read K/V in place from the paged cache "
        "through a flex_attention kernel inductor compiles at each worker's start (6-18 s; faster "
        "in fp32, even in bf16)",
    )
    compile_decode: bool = setting(
        False,
        unset=None,
        help="decode-only steps run a compiled step (torch.compile: on CUDA, CUDA graphs per batch "
        "bucket up to --max-num-seqs; on the CPU, one decoder layer compiled by inductor). Default: "
        "on where it is faster: on a GPU, and on the CPU with --quantization int8; otherwise off on "
        "the CPU, where eager decode reads the paged cache with the same kernel and the compiled step "
        "gains nothing (docs/BENCHMARKS.md). The first compile takes tens of seconds on a CPU, later "
        "starts read ~/.cache/omni-serve/inductor. --enforce-eager turns it off",
    )
    quantization: str | None = setting(
        None,
        vllm_alias="-q",
        metavar="{int8,gguf}",
        help="int8: the LLM's linear layers hold int8 weights, one scale per output channel, "
        "quantized from the checkpoint's (or GGUF file's) weights while loading; activations keep "
        "about --dtype's precision (vLLM's tpu_int8 names the same scheme). The fused q|k|v and "
        "the MLP's down projections stay in --dtype, as llama.cpp's k-quant mixes keep them wider. "
        "A device without an int8 kernel refuses it. gguf (--model FILE.gguf): the file's Q8_0, "
        "Q4_0 and Q4_1 blocks are served as they are (a tied output projection too), each row of "
        "activations quantized per block of 32 as llama.cpp does; other block types are "
        "dequantized to --dtype. CPUs with AVX512-VNNI only; elsewhere refused with the reason",
    )
    speculative_config: str | None = setting(
        None,
        metavar="JSON",
        help='speculative decoding, vLLM\'s JSON: {"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_min": 2, "prompt_lookup_max": 4}. ngram drafts by prompt lookup, in the '
        "worker; every sampling field applies and output keeps its distribution (greedy: the same tokens); "
        'a request may send "speculative": false (README.md). '
        "disable_by_batch_size N: no drafts while more than N requests run. "
        '{"method": "suffix"} drafts by suffix decoding, with vLLM\'s suffix_decoding_* keys',
    )
    # --speculative-config parsed (omni/cli/options.py); None: no speculation
    speculative: SpeculativeConfig | None = None
    max_logprobs: int = setting(
        20,
        type="positive_int",
        help="the most logprobs (or top_logprobs, prompt_logprobs) a request may ask for (default 20)",
    )

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """The devices the workers are placed on, round-robin."""
        return self.devices or (self.device,)


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """The most requests, and prompt tokens, that may wait for a model across its workers (None:
    derived from each live worker's KV cache and batch, omni/engines/admission.py), and the
    deadline of each request."""

    max_queued_requests: int | None = setting(
        None,
        type="positive_int",
        help="requests that may wait for a model, across its workers; beyond it a 429 "
        "(default: 2 x --max-num-seqs per live worker)",
    )
    max_queued_tokens: int | None = setting(
        None,
        type="positive_int",
        help="prompt tokens that may wait for a model, across its workers; beyond it a 429 "
        "(default per live worker: 2 x its KV cache's tokens, at least --max-num-seqs "
        "prompts of the full context length)",
    )
    # Seconds from a request's prompt being ready (Request.arrival_time) after which it is
    # aborted; None: no deadline unless the request asks for one (X-Request-Timeout).
    request_timeout: float | None = setting(
        None,
        type="positive_float",
        metavar="SECONDS",
        help="abort a request this long after its prompt is ready (a 504, or an error "
        "event in a stream); a request may ask for less with the X-Request-Timeout header "
        "(default: no deadline)",
    )


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    """An omni model's encoder worker and the queue of media items waiting for it."""

    device: str | None = setting(
        None, flag="--encoder-device", help="device of the encoder worker (default: the first LLM device)"
    )
    max_batch_items: int = 32
    # Media items, and their bytes, that may wait for the encoder; None: derived from the
    # batch size and the per-item byte limit (omni/engines/encoder.py).
    max_queued_items: int | None = setting(
        None,
        flag="--max-queued-media-items",
        type="positive_int",
        help="media items that may wait for a model's encoder; beyond it a 429 (default: 4 batches)",
    )
    max_queued_bytes: int | None = setting(
        None,
        flag="--max-queued-media-bytes",
        type="size",
        help="bytes of media that may wait for a model's encoder; beyond it a 429 (default: 8 x --max-media-bytes)",
    )


@dataclass(frozen=True, slots=True)
class VisionDecoderConfig:
    """The image decoder: `replicas` groups, each one process per device of its share of
    `devices` (empty: one process each, on the encoder's device): a Ulysses group when there
    are several, or two of half the devices each with guidance parallelism
    (omni/engines/worker_specs.py: DecoderLayout)."""

    devices: tuple[str, ...] = setting(
        (),
        flag="--vision-decoder-devices",
        type="devices",
        help="devices of the image decoder, comma-separated, one process each: several make one "
        "Ulysses sequence-parallel group (e.g. cuda:2,cuda:3 or cpu,cpu; default: one, on the encoder's device)",
    )
    replicas: int = setting(
        1,
        flag="--vision-decoder-replicas",
        type="positive_int",
        help="independent image decoder groups; --vision-decoder-devices is split into this many equal groups "
        "(cuda:0,cuda:1,cuda:2,cuda:3 with 2: two Ulysses pairs; without it, each is one process on the encoder's "
        "device), and each image goes to the replica with the least work queued (default 1; docs/IMAGES.md)",
    )
    guidance_parallel: str = setting(
        "auto",
        flag="--image-guidance-parallel",
        choices=("auto", "on", "off"),
        help="run a guided step's two DiT passes (the transformer and its autoguidance twin, or CFG's "
        "conditional and unconditional) at once on two halves of --vision-decoder-devices, each half a Ulysses "
        "group: 2 x N devices; auto: on when the checkpoint guides and the device count is even (default auto)",
    )
    diffusion_steps: int = setting(25, help="denoising steps per image unless a request asks (default 25)")
    max_batch_images: int = setting(8, help="images drawn together in one batch (default 8)")
    # A batch's DiT tokens (16 pixels square each, Flux's 8x VAE and 2x2 patches), whatever
    # its image count: 8 images of 1024x1024, or 2 of 2048x2048 (review A7)
    max_batch_tokens: int = setting(
        32768, type="positive_int", help="DiT tokens (one per 16x16 pixels) of one image batch (default 32768)"
    )
    max_queued_images: int | None = setting(  # None: 4 batches
        None, help="images that may wait for the decoder; beyond it a 429 (default: 4 batches)"
    )
    compile_dit: bool = setting(
        False,
        unset=None,
        flag="--compile-dit",
        off_flag=("--no-compile-dit", "the image decoder's DiT runs eagerly, on a GPU too"),
        help="the image decoder's DiT blocks run compiled (torch.compile, inductor), compiled at the worker's "
        "start and cached in ~/.cache/omni-serve/inductor. Default: on when the decoder is on a GPU; off on the "
        "CPU, where the blocks are matmul-bound and it gains a few percent (docs/BENCHMARKS.md). "
        "--enforce-eager turns it off",
    )
    image_step_cache: float = setting(
        0.0,
        flag="--image-step-cache",
        help="the image decoder's first-block cache: a denoising step whose first DiT block moved less than "
        "this THRESHOLD (relative mean absolute change) since the blocks last ran skips the others; a request's "
        "step_cache_threshold overrides it (default 0: off; docs/IMAGES.md)",
    )


@dataclass(frozen=True, slots=True)
class AudioDecoderConfig:
    """The audio decoder (vocoder): one process on `device` (None: the encoder's device)."""

    device: str | None = setting(
        None, flag="--audio-decoder-device", help="device of the audio decoder (vocoder) process (default: the encoder's)"
    )
    first_chunk_units: int = setting(
        4,
        flag="--audio-first-chunk-units",
        type="positive_int",
        help="units (25 a second) of an audio span sent to the vocoder first, so sound starts early; at "
        "least the span's 3 (default 4: 160 ms)",
    )
    chunk_units: int = setting(
        25, flag="--audio-chunk-units", type="positive_int", help="units of each later chunk (default 25: 1 s)"
    )
    max_batch_streams: int = 32  # streams decoded together in one vocoder batch
    max_open_streams: int = setting(
        256,
        flag="--max-audio-streams",
        type="positive_int",
        help="answers the vocoder speaks at once; beyond it a request asking for audio is a 429 (default 256)",
    )


@dataclass(frozen=True, slots=True)
class ChatFormatConfig:
    """The chat format (omni/text/chat_format.py): "auto" parsers follow the chat template."""

    # replaces the checkpoint's template (the CLI reads the flag's file into it)
    chat_template: str | None = setting(
        None,
        metavar="FILE|TEMPLATE",
        help="Jinja chat template (a file, or the template itself) replacing the checkpoint's",
    )
    trust_request_chat_template: bool = setting(
        False, help="render a request's own `chat_template` (off: such a request is a 400)"
    )
    tool_call_parser: str = setting(
        "auto",
        help="how tool calls are read from the output: hermes, hyperclovax, none, or auto (from the chat template)",
    )
    enable_auto_tool_choice: bool = setting(
        True, help='serve tool_choice "auto" (the model decides whether to call); on by default'
    )
    reasoning_parser: str = setting(
        "auto",
        help="how <think> reasoning is moved into reasoning_content: think, none, or auto (from the chat template)",
    )


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """The artifact store: "" (local, under the cache root), "local:DIR" or "s3://BUCKET/PREFIX".
    The server opens it with all of these; the workers with the location and S3 settings."""

    location: str = setting(
        "",
        flag="--store",
        metavar="local:DIR|s3://BUCKET/PREFIX",
        help="artifact store for encoder outputs and generated media "
        "(default: local, under $OMNI_SERVE_CACHE or ~/.cache/omni-serve)",
    )
    url_base: str | None = setting(  # default http://host:port
        None,
        flag="--store-url-base",
        help="public base URL for the local store's signed links (default http://HOST:PORT); "
        "their HMAC key is $OMNI_STORE_SECRET, else random per process",
    )
    endpoint_url: str | None = setting(None, flag="--store-endpoint-url", help="S3 endpoint (MinIO, moto, ...)")
    region: str | None = setting(None, flag="--store-region", help="S3 region")
    secret: bytes | None = None  # HMAC key of local signed URLs ($OMNI_STORE_SECRET); default random per process


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One served model: its names, its checkpoint's parts (None: the model has no such part, or
    its output is turned off), and the settings of each of its components."""

    name: str
    model_dir: Path  # the LLM's checkpoint
    aliases: tuple[str, ...] = ()  # more names clients may send for this model
    encoder_dir: Path | None = None  # an omni checkpoint's root (its encoder component directories)
    vision_decoder_dir: Path | None = None
    audio_decoder_dir: Path | None = None
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    media_limits: MediaLimits = field(default_factory=MediaLimits)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    vision_decoder: VisionDecoderConfig = field(default_factory=VisionDecoderConfig)
    audio_decoder: AudioDecoderConfig = field(default_factory=AudioDecoderConfig)
    chat_format: ChatFormatConfig = field(default_factory=ChatFormatConfig)


@dataclass(frozen=True, slots=True)
class CorsPolicy:
    """Which browser origins may call the API (omni/http/cors.py answers their preflights and marks
    their responses). An origin is "*" (any) or a full "scheme://host[:port]"."""

    origins: tuple[str, ...] = setting(
        (),
        flag="--allowed-origins",
        type="string_list",
        help="browser origins allowed to call the API (CORS), a JSON list or comma-separated: "
        '\'["https://ui.example.com"]\' or "*" (default: none, CORS off)',
    )
    methods: tuple[str, ...] = setting(
        ("*",), flag="--allowed-methods", type="string_list", help="CORS methods (default: all)"
    )
    headers: tuple[str, ...] = setting(
        ("*",), flag="--allowed-headers", type="string_list", help="CORS request headers (default: all)"
    )
    allow_credentials: bool = setting(False, help="CORS: let browsers send credentials")
    max_age: int = 600  # seconds a browser may cache a preflight's answer


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The HTTP server (where it listens, what it accepts, how it treats connections), the
    artifact store it opens, and the models it serves."""

    models: tuple[ModelConfig, ...] = ()
    store: StoreConfig = field(default_factory=StoreConfig)
    host: str = setting("127.0.0.1")
    port: int = setting(8000)
    max_request_bytes: int = setting(
        64 * 1024 * 1024, type="size", help="largest request body (media travel inline as base64; default 64MiB)"
    )
    api_key: str | None = setting(
        None, env="OMNI_SERVE_API_KEY", help="require this bearer token (default: $OMNI_SERVE_API_KEY)"
    )
    max_n: int = 16
    realtime_max_buffer_seconds: float = setting(
        120.0, help="seconds of uncommitted input audio a realtime session may hold (an error event past it)"
    )
    shutdown_timeout: float = setting(60.0, help="seconds in-flight requests get to finish after SIGTERM")
    # Connection hygiene (omni/http/connections.py): a request's headers must arrive within
    # header_timeout s of its first byte (of the connection, for its first request), its body
    # within body_timeout s; an idle keep-alive connection closes after keepalive_timeout s;
    # past max_connections open at once, a new connection gets a 503 and is closed.
    header_timeout: float = setting(
        20.0, help="seconds a request's headers may take to arrive; a slower client is cut off"
    )
    body_timeout: float = setting(60.0, help="seconds a request's body may take to arrive (a 408 after)")
    keepalive_timeout: float = setting(30.0, help="seconds an idle keep-alive connection stays open")
    max_connections: int = setting(1024, help="open connections at most; past it a new one gets a 503")
    disable_log_requests: bool = setting(
        False,
        help="no access log line per request (vLLM's name); by default each request logs its status, "
        "model, tokens, TTFT, latency and X-Request-Id",
    )
    # TLS: both set, the server speaks HTTPS; ssl_ca_certs (with ssl_cert_reqs) verifies clients.
    ssl_keyfile: str | None = setting(
        None, help="TLS private key (PEM); with --ssl-certfile the server speaks HTTPS"
    )
    ssl_certfile: str | None = setting(None, help="TLS certificate chain (PEM)")
    ssl_ca_certs: str | None = setting(None, help="CA certificates (PEM) that client certificates are checked against")
    ssl_cert_reqs: int = setting(  # ssl.CERT_NONE; 2 (CERT_REQUIRED) demands a client certificate
        0,
        choices=(0, 1, 2),
        help="client certificates: 0 not asked, 1 checked when sent, 2 required (Python's ssl.CERT_*)",
    )
    # The path prefix a reverse proxy serves the API under ("/omni"); "" when at the root.
    root_path: str = setting(
        "",
        help="path prefix a reverse proxy serves the API under (e.g. /omni): requests are "
        "answered with or without it, and generated URLs carry it",
    )
    # On by default, as a fresh `omni-serve` is most often tried by hand; the page is static
    # files calling the API with the API's own auth, so it adds no access, only a surface that
    # a production deployment has no use for (docs/PLAYGROUND.md).
    ui: bool = setting(
        True,
        help="serve the browser playground (chat, images, voice) at /playground, and redirect / to it; "
        "on by default, --no-ui in production",
    )
    log_stats_interval: float | None = setting(  # None: no stats line
        10.0,
        type="positive_float",
        metavar="SECONDS",
        help="seconds between stats lines: throughput, running and waiting requests, KV usage, "
        "prefix cache hit rate (default 10)",
    )
    cors: CorsPolicy | None = None  # None: no CORS headers, preflights refused (same-origin only)

    @property
    def base_url(self) -> str:
        """Where this server answers, as a client on this host reaches it."""
        scheme = "https" if self.ssl_certfile else "http"
        return f"{scheme}://{self.host}:{self.port}{self.root_path}"
