"""Worker specs: what one worker process (or process group) is told to become.

A spec's type names its worker kind: gpu_workers/runner.py maps each spec type to one runner
class, and each kind answers with its own ready message (READY). Specs travel to the child as
protocol messages, so nothing crossing the boundary is pickled. A new worker kind is a spec
here and a runner class there, not a branch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from omni.shared.media.limits import MediaLimits
from omni.shared.protocol.messages import AudioDecoderReady, EncoderReady, LLMReady, VisionDecoderReady
from omni.shared.protocol.wire import message, register

# The media layer's limits travel inside the encoder's spec as they are.
register(MediaLimits, tag=30)


@message
@dataclass(frozen=True, slots=True)
class StoreSettings:
    """The artifact store a worker opens (omni/shared/store/spec.py syntax; "" is the default
    local one)."""

    TAG: ClassVar[int] = 31
    location: str = ""
    endpoint_url: str | None = None
    region: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """Fields every worker kind has. Subclasses set TAG, READY and LABEL."""

    TAG: ClassVar[int]
    READY: ClassVar[type]
    LABEL: ClassVar[str]  # how logs, errors and process names call the kind: "llm worker"

    worker_id: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    num_threads: int | None = None
    # Processes in the worker's torch.distributed group (NCCL on GPU, gloo on CPU). Rank 0
    # owns the pipe; the group starts, dies and restarts as a whole.
    world_size: int = 1
    seed: int | None = None  # seeds torch's generators at start (--seed); None: random


@message
@dataclass(frozen=True, slots=True, kw_only=True)
class LLMWorkerSpec(WorkerSpec):
    TAG: ClassVar[int] = 20
    READY: ClassVar[type] = LLMReady
    LABEL: ClassVar[str] = "llm worker"

    model_dir: str
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None  # on GPU, when neither size above is given
    # On a GPU, before sizing the KV cache: the largest step's tokens, run once to measure its
    # activations, and how many LLM workers of this device (this one included) are still to
    # size theirs: each takes an equal share of what the device has left (gpu_workers/llm/memory.py).
    profile_tokens: int = 0
    memory_shares: int = 1
    max_model_len: int | None = None
    attention_backend: str = "auto"
    # decode-only steps through a compiled step padded to buckets up to max_num_seqs
    # (gpu_workers/llm/decode_graph.py); False: eager (--enforce-eager)
    compile_decode: bool = False
    max_num_seqs: int = 64
    quantization: str | None = None  # "int8": int8 Linear weights with per-channel scales
    # Where injected embeddings are read from; None for a text-only LLM, which opens none.
    store: StoreSettings | None = None
    embedding_cache_bytes: int = 1024**3
    # Speculative decoding (omni/shared/speculative.py): the drafter, None for none; the most
    # draft tokens a step verifies per request; the n-gram sizes prompt lookup tries.
    speculative_method: str | None = None
    num_speculative_tokens: int = 0
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 1
    # suffix decoding's trees (gpu_workers/spec/suffix.py): their depth, how many finished
    # requests' outputs the global one holds, and when a draft stops
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1


@message
@dataclass(frozen=True, slots=True, kw_only=True)
class EncoderWorkerSpec(WorkerSpec):
    TAG: ClassVar[int] = 21
    READY: ClassVar[type] = EncoderReady
    LABEL: ClassVar[str] = "encoder worker"

    model_dir: str  # the omni checkpoint root: one directory per encoder component
    store: StoreSettings = field(default_factory=StoreSettings)
    media_limits: MediaLimits = field(default_factory=MediaLimits)


@message
@dataclass(frozen=True, slots=True, kw_only=True)
class VisionDecoderWorkerSpec(WorkerSpec):
    """The image decoder: a DiT, its weak autoguidance twin, a VAE. world_size > 1 runs the
    DiT with Ulysses sequence parallelism over the group (one process per device), or over
    each half of it with guidance_parallel."""

    TAG: ClassVar[int] = 22
    READY: ClassVar[type] = VisionDecoderReady
    LABEL: ClassVar[str] = "vision decoder"

    model_dir: str  # the checkpoint's vision_decoder/ directory
    vae_dtype: str = "float32"  # the VAE's own (rank 0's); `dtype` is the DiT's
    # The largest batch the engine sends (its profile run on a GPU draws one)
    max_batch_images: int = 8
    max_batch_tokens: int = 32768
    # The device of each rank (rank_devices[0] == device); empty: every rank on `device`.
    rank_devices: list[str] = field(default_factory=list)
    compile_dit: bool = False  # the DiT's blocks through torch.compile (vision_decoder/compiled_dit.py)
    # Guidance parallelism: ranks [0, N) run the transformer (CFG: the conditional pass), ranks
    # [N, 2N) its twin (the unconditional pass), each half a Ulysses group (world_size = 2N)
    guidance_parallel: bool = False

    def device_of(self, rank: int) -> str:
        return self.rank_devices[rank] if self.rank_devices else self.device


@message
@dataclass(frozen=True, slots=True, kw_only=True)
class AudioDecoderWorkerSpec(WorkerSpec):
    """The audio decoder: a causal unit vocoder (and the speaker encoder, when the checkpoint
    has one). Streams of units arrive in chunks; each stream's state stays in the worker."""

    TAG: ClassVar[int] = 23
    READY: ClassVar[type] = AudioDecoderReady
    LABEL: ClassVar[str] = "audio decoder"

    model_dir: str  # the checkpoint's audio_decoder/ directory
