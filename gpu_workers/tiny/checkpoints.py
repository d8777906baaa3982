"""Deterministic tiny random LLM checkpoints in the HF on-disk layout.

A checkpoint is config.json + model.safetensors + generation_config.json (+ the tiny
tokenizer's files when gpu_workers.tiny.tokenizer is importable). Weights are drawn from a
seeded generator in sorted-name order, so the same arguments give the same bytes. All four
types also load in transformers' AutoModelForCausalLM (hyperclovax as transformers 5's native
HyperCLOVAXForCausalLM), which names the Peri-LN norms model.layers.N.post_norm1.weight /
post_norm2.weight, as gpu_workers/models/llama.py reads them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from gpu_workers.models.llama import ARCHITECTURES, LlamaFamilyConfig

DEFAULT_VOCAB_SIZE = 512  # used when no tokenizer is written
_VOCAB_MULTIPLE = 64

_BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 8192,
    "rope_theta": 10000.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
    "initializer_range": 0.1,  # larger than real models' 0.02 so greedy picks are not near-ties
    "torch_dtype": "float32",
}
# muP values in the spirit of the reference model (attention_multiplier = 1 / head_dim). The
# logits come out at half size in both: granite divides them by its logits_scaling, hyperclovax
# multiplies them by its own (gpu_workers/models/llama.py).
_MUP: dict[str, Any] = {
    "embedding_multiplier": 4.0,
    "attention_multiplier": 1 / 16,
    "residual_multiplier": 0.5,
}
_PER_TYPE: dict[str, dict[str, Any]] = {
    "llama": {"attention_bias": False, "mlp_bias": False},
    "qwen2": {"use_sliding_window": False},
    "granite": {"attention_bias": False, "mlp_bias": False, **_MUP, "logits_scaling": 2.0},
    "hyperclovax": {"attention_bias": False, "mlp_bias": False, **_MUP, "logits_scaling": 0.5, "use_post_norm": True},
}


def hf_tensor_shapes(config: LlamaFamilyConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this config holds, by HF name."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kv = config.q_size, config.kv_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        layer = {
            "input_layernorm.weight": (h,),
            "post_attention_layernorm.weight": (h,),
            "self_attn.q_proj.weight": (q, h),
            "self_attn.k_proj.weight": (kv, h),
            "self_attn.v_proj.weight": (kv, h),
            "self_attn.o_proj.weight": (h, q),
            "mlp.gate_proj.weight": (i, h),
            "mlp.up_proj.weight": (i, h),
            "mlp.down_proj.weight": (h, i),
        }
        if config.qkv_bias:
            layer |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
        if config.o_bias:
            layer["self_attn.o_proj.bias"] = (h,)
        if config.mlp_bias:
            layer |= {"mlp.gate_proj.bias": (i,), "mlp.up_proj.bias": (i,), "mlp.down_proj.bias": (h,)}
        if config.use_post_norm:
            layer |= {"post_norm1.weight": (h,), "post_norm2.weight": (h,)}
        shapes |= {p + k: s for k, s in layer.items()}
    return shapes


def make_tiny_checkpoint(
    out_dir: Path,
    model_type: str = "hyperclovax",
    *,
    seed: int = 0,
    num_audio_codes: int = 64,
    **overrides: Any,
) -> Path:
    """Write a tiny random checkpoint into out_dir; overrides are HF config.json keys."""
    if model_type not in ARCHITECTURES:
        raise ValueError(f"unknown model_type {model_type!r}; supported: {', '.join(ARCHITECTURES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    special_ids: dict[str, int] = {}
    tokenizer_len = _write_tokenizer(out_dir, special_ids, num_audio_codes)

    raw: dict[str, Any] = {"model_type": model_type, "architectures": [ARCHITECTURES[model_type]]}
    raw |= _BASE | _PER_TYPE[model_type]
    rounded = -(-tokenizer_len // _VOCAB_MULTIPLE) * _VOCAB_MULTIPLE
    raw["vocab_size"] = rounded if tokenizer_len else DEFAULT_VOCAB_SIZE
    if special_ids:
        raw |= {
            "bos_token_id": special_ids["<|endoftext|>"],
            "eos_token_id": special_ids["<|im_end|>"],
            "pad_token_id": special_ids["<|endoftext|>"],
        }
    raw |= overrides
    if "rope_theta" in overrides and "rope_parameters" not in overrides:
        raw["rope_parameters"] = {**raw["rope_parameters"], "rope_theta": overrides["rope_theta"]}
    if tokenizer_len > raw["vocab_size"]:
        raise ValueError(f"vocab_size {raw['vocab_size']} is smaller than the tokenizer ({tokenizer_len})")
    config = LlamaFamilyConfig.from_hf(raw)

    tensors = _random_tensors(hf_tensor_shapes(config), seed, float(raw.get("initializer_range", 0.02)))
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    (out_dir / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    generation = {k: raw[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in raw}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    return out_dir


def _random_tensors(shapes: dict[str, tuple[int, ...]], seed: int, std: float) -> dict[str, torch.Tensor]:
    """Seeded noise in sorted-name order, so the same shapes and seed give the same bytes."""
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in sorted(shapes.items()):
        noise = torch.randn(shape, generator=gen)
        is_norm = "norm" in name or ".ln_" in name or name.startswith("ln_")
        if is_norm and name.endswith(".weight"):
            tensors[name] = 1.0 + 0.1 * noise  # near one, but not one, so a missed norm shows
        elif name.endswith(".bias"):
            tensors[name] = 0.1 * noise
        else:
            tensors[name] = std * noise
    return tensors


def _write_tokenizer(out_dir: Path, special_ids: dict[str, int], num_audio_codes: int = 64) -> int:
    """Tokenizer length, or 0 when the tiny tokenizer is not available."""
    try:
        from gpu_workers.tiny.tokenizer import build_tiny_tokenizer
    except ImportError:
        return 0
    length = build_tiny_tokenizer(out_dir, num_audio_codes=num_audio_codes)
    vocab = json.loads((out_dir / "tokenizer.json").read_text())["added_tokens"]
    special_ids.update({t["content"]: t["id"] for t in vocab})
    return length


# ---- encoders: one directory per component, as a converted reference checkpoint has ---------
TINY_VISION_ENCODER: dict[str, Any] = {
    "model_type": "qwen2_5_vl_vision",
    "depth": 2,
    "hidden_size": 32,
    "num_heads": 2,
    "intermediate_size": 64,
    "out_hidden_size": 64,
    "fullatt_block_indexes": [1],
    "window_size": 56,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "in_channels": 3,
    "hidden_act": "silu",
}
# Small pixel budgets keep the tiny model's prompts short: at most 16 rows per image.
TINY_VISION_PREPROCESSOR: dict[str, Any] = {
    "min_pixels": 3_136,
    "max_pixels": 112 * 112,
    "video_max_pixels": 56 * 56,
    "video_min_frames": 4,
    "video_frames_per_chunk": 32,
}
TINY_AUDIO_ENCODER: dict[str, Any] = {
    "model_type": "qwen2_audio_encoder",
    "num_mel_bins": 128,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "d_model": 32,
    "max_source_positions": 1500,
    "activation_function": "gelu",
}


def _save_component(out_dir: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out_dir


def make_tiny_vision_encoder(out_dir: Path, *, seed: int = 0, projector_hidden_size: int = 64) -> Path:
    """Qwen2.5-VL vision tower + projector in transformers' names (Conv3d patch embedding)."""
    from gpu_workers.models.qwen2_5_vl_vision import Qwen2_5_VisionEncoder, VisionEncoderConfig

    config = {**TINY_VISION_ENCODER, "projector_hidden_size": projector_hidden_size}
    vc = VisionEncoderConfig.from_hf(config)
    shapes = {n: tuple(t.shape) for n, t in Qwen2_5_VisionEncoder(vc).state_dict().items()}
    shapes["patch_embed.proj.weight"] = (
        vc.hidden_size, vc.in_channels, vc.temporal_patch_size, vc.patch_size, vc.patch_size
    )  # fmt: skip
    _save_component(Path(out_dir), config, _random_tensors(shapes, seed, 0.15))
    (Path(out_dir) / "preprocessor_config.json").write_text(
        json.dumps(TINY_VISION_PREPROCESSOR, indent=2, sort_keys=True) + "\n"
    )
    return Path(out_dir)


def make_tiny_audio_encoder(out_dir: Path, *, seed: int = 0, projector_hidden_size: int = 64) -> Path:
    from gpu_workers.models.qwen2_audio_encoder import AudioEncoderConfig, Qwen2AudioEncoder

    config = {**TINY_AUDIO_ENCODER, "projector_hidden_size": projector_hidden_size}
    module = Qwen2AudioEncoder(AudioEncoderConfig.from_hf(config))
    shapes = {n: tuple(t.shape) for n, t in module.state_dict().items()}
    return _save_component(Path(out_dir), config, _random_tensors(shapes, seed, 0.15))


# FSQ levels of the tiny audio tokenizer: 3^4 = 81 units, so the tiny vocabulary has 81 audio
# unit tokens (the reference: 3^8 = 6,561).
TINY_AUDIO_LEVELS = (3, 3, 3, 3)
TINY_IMAGE_CODEBOOK = 64


# ---- the vision decoder (gpu_workers/vision_decoder/decoder.py's layout) ----------------------------
# The tiny LLM has 64 image code tokens and short contexts: an 8 x 8 code grid.
TINY_CODE_GRID = (8, 8)
# A Flux DiT of patch 2 (2,304 tokens at 768 x 768), small enough for a CPU; the weak
# autoguidance twin is the same with one block.
TINY_DIT: dict[str, Any] = {
    "in_channels": 16,
    "hidden_size": 32,
    "num_heads": 2,
    "num_layers": 2,
    "mlp_ratio": 2.0,
    "axes_dims_rope": [4, 6, 6],
    "patch": 2,
}
# A diffusers AutoencoderKL config of the Flux VAE's family (16 latent channels, its scaling and
# shift, four blocks for 8x). Its cost is in the full-resolution block (7 convolutions over
# every pixel): 4 channels there, 8 below, and no mid-block attention, which would attend over
# every latent pixel (9,216 of them at 768 x 768).
TINY_VAE: dict[str, Any] = {
    "_class_name": "AutoencoderKL",
    "act_fn": "silu",
    "block_out_channels": [4, 4, 8, 8],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "force_upcast": True,
    "in_channels": 3,
    "latent_channels": 16,
    "latents_mean": None,
    "latents_std": None,
    "layers_per_block": 1,
    "mid_block_add_attention": False,
    "norm_num_groups": 2,
    "out_channels": 3,
    "sample_size": 1024,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "use_post_quant_conv": False,
    "use_quant_conv": False,
}
# black-forest-labs/FLUX.1-dev scheduler/scheduler_config.json: dynamic (resolution) shifting
TINY_SCHEDULER: dict[str, Any] = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}
DEFAULT_GUIDANCE_SCALES = {"autoguidance": 0.75, "cfg": 4.0, "none": 0.0}


def _fan_in_tensors(
    shapes: dict[str, tuple[int, ...]], seed: int, gains: dict[str, float] | None = None
) -> dict[str, torch.Tensor]:
    """Seeded noise in sorted-name order, each weight of std gain / sqrt(fan_in) (gain 1 unless
    named), so that activations stay of order one through a deep stack: a DiT's or a VAE's
    output is then neither flat nor saturated. Norm scales near 1, biases small."""
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in sorted(shapes.items()):
        noise = torch.randn(shape, generator=gen)
        if "norm" in name and name.endswith(".weight"):
            tensors[name] = 1.0 + 0.1 * noise
        elif name.endswith(".bias") or len(shape) < 2:
            tensors[name] = 0.05 * noise
        else:
            fan_in = math.prod(shape[1:])  # (out, in) or (out, in, kh, kw)
            tensors[name] = noise * ((gains or {}).get(name, 1.0) / math.sqrt(fan_in))
    return tensors


def make_tiny_vision_decoder(
    out_dir: Path,
    *,
    seed: int = 0,
    codebook: torch.Tensor,
    guidance: str = "autoguidance",
    code_grid: tuple[int, int] = TINY_CODE_GRID,
    dit: Mapping[str, Any] = TINY_DIT,
) -> Path:
    """config.json, codebook.safetensors, transformer/ (dit: its FluxDiT config keys), vae/,
    scheduler/, and weak_transformer/ (autoguidance: dit with one block) or uncond.safetensors
    (cfg); codebook (num_codes, cond) is the image tokenizer's. Random weights scaled so that
    an image has visibly varied pixels."""
    from gpu_workers.models.flux_dit import FluxDiT, FluxDiTConfig
    from gpu_workers.models.flux_vae import FluxVAEConfig, FluxVAEDecoder
    from gpu_workers.vision_decoder.layout import CODEBOOK_FILE, UNCOND_FILE, VisionDecoderConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = VisionDecoderConfig((code_grid[0], code_grid[1]), guidance, DEFAULT_GUIDANCE_SCALES[guidance])
    (out_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
    codebook = codebook.float().contiguous()
    save_file({"codebook": codebook}, str(out_dir / CODEBOOK_FILE), metadata={"format": "pt"})

    width = int(codebook.shape[1])
    dits = {"transformer": dit, "weak_transformer": {**dit, "num_layers": 1}}
    for offset, (name, raw) in enumerate(dits.items()):
        if name == "weak_transformer" and guidance != "autoguidance":
            continue
        dit_config = FluxDiTConfig.from_dict({**raw, "cond_channels": width, "vec_in_dim": width})
        with torch.device("meta"):
            shapes = {n: tuple(t.shape) for n, t in FluxDiT(dit_config).state_dict().items()}
        _save_component(out_dir / name, dit_config.to_dict(), _fan_in_tensors(shapes, seed + offset))
    if guidance == "cfg":
        gen = torch.Generator().manual_seed(seed + 2)
        embedding = torch.randn(width, generator=gen)
        save_file({"embedding": embedding}, str(out_dir / UNCOND_FILE), metadata={"format": "pt"})

    with torch.device("meta"):
        vae = FluxVAEDecoder(FluxVAEConfig.from_diffusers(TINY_VAE))
    shapes = {n: tuple(t.shape) for n, t in vae.state_dict().items()}
    vae_dir = out_dir / "vae"
    vae_dir.mkdir(parents=True, exist_ok=True)
    # a gentler last convolution, so the image spreads over [-1, 1] without saturating
    tensors = _fan_in_tensors(shapes, seed + 3, {"decoder.conv_out.weight": 0.5})
    save_file(tensors, str(vae_dir / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    (vae_dir / "config.json").write_text(json.dumps(TINY_VAE, indent=2, sort_keys=True) + "\n")
    scheduler_dir = out_dir / "scheduler"
    scheduler_dir.mkdir(parents=True, exist_ok=True)
    (scheduler_dir / "scheduler_config.json").write_text(json.dumps(TINY_SCHEDULER, indent=2, sort_keys=True) + "\n")
    return out_dir


# ---- the audio decoder (gpu_workers/models/unit_vocoder.py's layout) ------------------------
# The real hop (960 samples a unit at 24 kHz, 25 units a second) in five stages, as narrow as
# keeps each stage at least 2 channels wide (64 -> 32 -> 16 -> 8 -> 4 -> 2), with two AMP
# kernels; one second of audio costs about 0.2 s of one CPU thread.
TINY_VOCODER: dict[str, Any] = {
    "unit_embed_dim": 32,
    "speaker_embed_dim": 16,
    "sample_rate": 24000,
    "units_per_second": 25,
    "upsample_rates": [8, 5, 4, 3, 2],
    "upsample_kernel_sizes": [16, 10, 8, 6, 4],
    "upsample_initial_channel": 64,
    "resblock_kernel_sizes": [3, 7],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]],
    "speaker_encoder": {"sample_rate": 16000, "num_mel_bins": 80, "channels": 32, "kernel_size": 5, "num_layers": 2},
}
# Our own neutral voice names (materials, in the spirit of OpenAI's "alloy"): the rows of the
# tiny speaker table, in order. OpenAI's voice names are mapped onto a checkpoint's voices by
# the server, not written here.
TINY_VOICES = ("amber", "basalt", "cobalt", "linen")


def make_tiny_audio_decoder(
    out_dir: Path,
    *,
    seed: int = 0,
    num_units: int = math.prod(TINY_AUDIO_LEVELS),
    voices: tuple[str, ...] = TINY_VOICES,
) -> Path:
    """config.json, model.safetensors (the vocoder and its speaker table), speakers.json and
    speaker_encoder.safetensors; num_units is the LLM's count of audio unit tokens. Random
    weights scaled so that the audio is neither silent nor clipped (RMS about 0.2)."""
    from gpu_workers.models.unit_vocoder import (
        SPEAKER_ENCODER_FILE,
        SPEAKERS_FILE,
        WEIGHTS_FILE,
        SpeakerEncoderConfig,
        UnitVocoderConfig,
        random_speaker_encoder,
        random_unit_vocoder,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = UnitVocoderConfig.from_dict({**TINY_VOCODER, "num_units": num_units, "num_speakers": len(voices)})
    vocoder = random_unit_vocoder(config, seed)
    save_file(vocoder.state_dict(), str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    assert isinstance(config.speaker_encoder, SpeakerEncoderConfig)
    encoder = random_speaker_encoder(config.speaker_encoder, config.speaker_embed_dim, seed + 1)
    save_file(encoder.state_dict(), str(out_dir / SPEAKER_ENCODER_FILE), metadata={"format": "pt"})
    (out_dir / SPEAKERS_FILE).write_text(json.dumps({"speakers": list(voices)}, indent=2) + "\n")
    (out_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
    return out_dir


def make_tiny_component_checkpoint(out_dir: Path, *, seed: int = 0) -> Path:
    """The per-component layout the reference's converter writes: llm/ (tiny hyperclovax),
    vision_encoder/, audio_encoder/, image_tokenizer/, audio_tokenizer/, vision_decoder/ (on the
    image tokenizer's codebook), audio_decoder/ (one unit per audio unit token of the LLM)."""
    from gpu_workers.models.fsq_audio_tokenizer import make_tiny_audio_tokenizer
    from gpu_workers.models.ta_tok import make_tiny_image_tokenizer

    out_dir = Path(out_dir)
    num_units = 1
    for level in TINY_AUDIO_LEVELS:
        num_units *= level
    make_tiny_checkpoint(out_dir / "llm", "hyperclovax", seed=seed, num_audio_codes=num_units)
    hidden = int(_BASE["hidden_size"])
    make_tiny_vision_encoder(out_dir / "vision_encoder", seed=seed + 1, projector_hidden_size=hidden)
    make_tiny_audio_encoder(out_dir / "audio_encoder", seed=seed + 2, projector_hidden_size=hidden)
    make_tiny_image_tokenizer(out_dir / "image_tokenizer", seed=seed + 3, codebook_size=TINY_IMAGE_CODEBOOK)
    make_tiny_audio_tokenizer(out_dir / "audio_tokenizer", seed=seed + 4, levels=TINY_AUDIO_LEVELS)
    codebook = load_file(out_dir / "image_tokenizer" / "model.safetensors")["codebook.weight"]
    make_tiny_vision_decoder(out_dir / "vision_decoder", seed=seed + 5, codebook=codebook)
    make_tiny_audio_decoder(out_dir / "audio_decoder", seed=seed + 6, num_units=num_units)
    return out_dir
