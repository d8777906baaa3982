"""A model's config as each of its worker processes gets it: the one place specs are built, so
every kind reads the same settings the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni.config import ModelConfig, StoreConfig, WorkerConfig
from omni.model_layout import vision_decoder_guidance
from omni.shared import protocol
from omni.shared.speculative import SpeculativeConfig

# What --component-dtype may name. The vision decoder's VAE has a dtype of its own.
DTYPE_COMPONENTS = ("llm", "encoder", "vision_decoder", "vae", "vocoder")


def component_dtype(worker: WorkerConfig, component: str, device: str) -> str:
    """A component's dtype (review B1, B2):

        --component-dtype NAME=...       as given
        llm                              --dtype (auto: float32 on the CPU, else bfloat16)
        vocoder                          float32: bfloat16 costs its audio ~36 dB SNR
                                         (docs/BENCHMARKS.md), and it is a small model
        --dtype auto (the default)       float32 on the CPU, bfloat16 on a GPU, per component's
                                         own device (not the LLM's)
        --dtype given                    that, but a VAE in float16 runs in float32 (Flux's
                                         VAE overflows in float16: diffusers' force_upcast)
    """
    assert component in DTYPE_COMPONENTS, component
    for entry in worker.component_dtype:
        name, _, dtype = entry.partition("=")
        if name == component:
            return dtype
    if component == "llm":
        return worker.dtype  # --dtype, auto resolved for the LLM's devices (omni/cli/options.py)
    if component == "vocoder":
        return "float32"
    requested = worker.requested_dtype
    if requested is None:
        return "float32" if device == "cpu" else "bfloat16"
    if component == "vae" and requested == "float16":
        return "float32"
    return requested


def store_settings(config: StoreConfig) -> protocol.StoreSettings:
    return protocol.StoreSettings(config.location, config.endpoint_url, config.region)


def llm_worker_spec(config: ModelConfig, worker_id: int, device: str) -> protocol.LLMWorkerSpec:
    """Only an omni model's LLM workers open the artifact store: a text-only LLM never reads it."""
    llm, worker = config.llm, config.worker
    return protocol.LLMWorkerSpec(
        worker_id=worker_id,
        device=device,
        dtype=component_dtype(worker, "llm", device),
        num_threads=worker.num_threads,
        seed=worker.seed,
        model_dir=str(config.model_dir),
        block_size=llm.block_size,
        num_kv_blocks=llm.num_kv_blocks,
        kv_cache_memory_bytes=llm.kv_cache_memory_bytes,
        gpu_memory_utilization=llm.gpu_memory_utilization,
        profile_tokens=llm.max_num_batched_tokens,
        max_model_len=llm.max_model_len,
        attention_backend=llm.attention_backend,
        compile_decode=llm.compile_decode,
        max_num_seqs=llm.max_num_seqs,
        quantization=llm.quantization,
        store=store_settings(config.store) if config.encoder_dir is not None else None,
        **_speculative_fields(llm.speculative),
    )


def _speculative_fields(spec: SpeculativeConfig | None) -> dict[str, Any]:
    if spec is None:
        return {}
    return {
        "speculative_method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "prompt_lookup_min": spec.prompt_lookup_min,
        "prompt_lookup_max": spec.prompt_lookup_max,
        "suffix_decoding_max_tree_depth": spec.suffix_decoding_max_tree_depth,
        "suffix_decoding_max_cached_requests": spec.suffix_decoding_max_cached_requests,
        "suffix_decoding_max_spec_factor": spec.suffix_decoding_max_spec_factor,
        "suffix_decoding_min_token_prob": spec.suffix_decoding_min_token_prob,
    }


def encoder_worker_spec(config: ModelConfig, device: str) -> protocol.EncoderWorkerSpec:
    assert config.encoder_dir is not None, "a text-only model has no encoder worker"
    return protocol.EncoderWorkerSpec(
        worker_id=0,
        device=device,
        dtype=component_dtype(config.worker, "encoder", device),
        num_threads=config.worker.num_threads,
        seed=config.worker.seed,
        model_dir=str(config.encoder_dir),
        store=store_settings(config.store),
        media_limits=config.media_limits,
    )


def encoder_device(config: ModelConfig) -> str:
    """--encoder-device, else the first LLM worker's device."""
    return config.encoder.device or config.llm.worker_devices[0]


def vision_decoder_devices(config: ModelConfig, replica: int = 0) -> tuple[str, ...]:
    """A replica's devices: --vision-decoder-devices split into --vision-decoder-replicas equal,
    consecutive groups (the CLI checks that they divide), else one rank on the encoder's device."""
    devices = config.vision_decoder.devices
    if not devices:
        return (encoder_device(config),)
    size = len(devices) // config.vision_decoder.replicas
    return devices[replica * size : (replica + 1) * size]


TWO_PASS_GUIDANCE = ("autoguidance", "cfg")  # a step of two DiT passes: what guidance parallelism splits


@dataclass(frozen=True, slots=True)
class DecoderLayout:
    """How the image decoder's devices are used: guidance_groups (1, or 2 with guidance
    parallelism) x ulysses_ranks = devices, one process each.

    devices   guidance parallel   layout
    1         -                   1 rank: every pass of a step one after the other
    N         off (or no guidance, or N odd)   1 Ulysses group of N, passes one after the other
    2N        on                  2 groups of N: transformer | transformer2 (CFG: conditional |
                                  unconditional), each a Ulysses group over its N
    """

    devices: int
    guidance_groups: int
    guidance: str  # the checkpoint's: autoguidance | cfg | none

    @property
    def ulysses_ranks(self) -> int:
        return self.devices // self.guidance_groups

    def describe(self) -> str:
        n = self.ulysses_ranks
        ranks = f"{n} Ulysses rank{'s' if n > 1 else ''}"
        if self.guidance_groups == 2:
            passes = "transformer | transformer2" if self.guidance == "autoguidance" else "conditional | unconditional"
            return f"{self.devices} devices = 2 guidance groups ({passes}) x {ranks}"
        one_after = ", the guidance's 2 passes one after the other" if self.guidance in TWO_PASS_GUIDANCE else ""
        if self.devices == 1:
            return f"1 device{one_after}"
        return f"{self.devices} devices = 1 group of {ranks}{one_after}"


def decoder_layout(devices: int, guidance_parallel: str, guidance: str) -> DecoderLayout:
    """The layout of `devices` under --image-guidance-parallel (auto | on | off) for a checkpoint
    of `guidance`; a ValueError naming why when `on` fits neither."""
    two_pass = guidance in TWO_PASS_GUIDANCE
    even = devices >= 2 and devices % 2 == 0
    if guidance_parallel == "off" or (guidance_parallel == "auto" and not (two_pass and even)):
        return DecoderLayout(devices, 1, guidance)
    if not two_pass:
        raise ValueError(
            "--image-guidance-parallel on: the image decoder has no guidance (one DiT pass a step), "
            "so there is no second pass to run in parallel"
        )
    if not even:
        raise ValueError(
            f"--image-guidance-parallel on: --vision-decoder-devices names {devices} device"
            f"{'s' if devices > 1 else ''}; guidance parallelism needs 2 x N (N Ulysses ranks for each of the "
            "guidance's 2 passes)"
        )
    return DecoderLayout(devices, 2, guidance)


def vision_decoder_layout(config: ModelConfig) -> DecoderLayout:
    assert config.vision_decoder_dir is not None, "the model has no vision decoder"
    devices = len(vision_decoder_devices(config))
    guidance = vision_decoder_guidance(config.vision_decoder_dir)
    return decoder_layout(devices, config.vision_decoder.guidance_parallel, guidance)


def audio_decoder_worker_spec(config: ModelConfig) -> protocol.AudioDecoderWorkerSpec:
    """--audio-decoder-device, else the encoder's device."""
    assert config.audio_decoder_dir is not None, "the model has no audio decoder"
    device = config.audio_decoder.device or encoder_device(config)
    return protocol.AudioDecoderWorkerSpec(
        worker_id=0,
        device=device,
        dtype=component_dtype(config.worker, "vocoder", device),
        num_threads=config.worker.num_threads,
        seed=config.worker.seed,
        model_dir=str(config.audio_decoder_dir),
    )


def vision_decoder_worker_specs(config: ModelConfig) -> list[protocol.VisionDecoderWorkerSpec]:
    """One spec per replica (worker_id: the replica's index)."""
    return [vision_decoder_worker_spec(config, r) for r in range(config.vision_decoder.replicas)]


def vision_decoder_worker_spec(config: ModelConfig, replica: int = 0) -> protocol.VisionDecoderWorkerSpec:
    assert config.vision_decoder_dir is not None, "the model has no vision decoder"
    devices = vision_decoder_devices(config, replica)
    return protocol.VisionDecoderWorkerSpec(
        worker_id=replica,
        device=devices[0],
        dtype=component_dtype(config.worker, "vision_decoder", devices[0]),
        vae_dtype=component_dtype(config.worker, "vae", devices[0]),
        max_batch_images=config.vision_decoder.max_batch_images,
        max_batch_tokens=config.vision_decoder.max_batch_tokens,
        num_threads=config.worker.num_threads,
        seed=config.worker.seed,
        world_size=len(devices),
        model_dir=str(config.vision_decoder_dir),
        compile_dit=config.vision_decoder.compile_dit,
        rank_devices=list(devices) if len(devices) > 1 else [],
        guidance_parallel=vision_decoder_layout(config).guidance_groups == 2,
    )
