"""Deterministic tiny random LLM checkpoints in the HF on-disk layout.

A checkpoint is config.json + model.safetensors + generation_config.json (+ the tiny
tokenizer's files when gpu_workers.tiny_tokenizer is importable). Weights are drawn from a
seeded generator in sorted-name order, so the same arguments give the same bytes. llama,
qwen2 and granite checkpoints also load in transformers' AutoModelForCausalLM; hyperclovax
has no transformers class (the reference uses remote code) and carries its Peri-LN norms as
model.layers.N.post_norm1.weight / post_norm2.weight, as gpu_workers/models/llama.py reads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from gpu_workers.models.llama import SUPPORTED_MODEL_TYPES, LlamaFamilyConfig

# Bump when the default checkpoint's bytes change, so caches built by older code are not reused.
TINY_CHECKPOINT_VERSION = "llm-v1"
DEFAULT_VOCAB_SIZE = 512  # used when no tokenizer is written
_VOCAB_MULTIPLE = 64

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "granite": "GraniteForCausalLM",
    "hyperclovax": "HyperCLOVAXForCausalLM",
}
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
# muP values in the spirit of the reference model (attention_multiplier = 1 / head_dim)
_MUP: dict[str, Any] = {
    "embedding_multiplier": 4.0,
    "attention_multiplier": 1 / 16,
    "residual_multiplier": 0.5,
    "logits_scaling": 2.0,
}
_PER_TYPE: dict[str, dict[str, Any]] = {
    "llama": {"attention_bias": False, "mlp_bias": False},
    "qwen2": {"use_sliding_window": False},
    "granite": {"attention_bias": False, "mlp_bias": False, **_MUP},
    "hyperclovax": {"attention_bias": False, "mlp_bias": False, **_MUP, "use_post_norm": True},
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


def make_tiny_checkpoint(out_dir: Path, model_type: str = "hyperclovax", *, seed: int = 0, **overrides: Any) -> Path:
    """Write a tiny random checkpoint into out_dir; overrides are HF config.json keys."""
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unknown model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    special_ids: dict[str, int] = {}
    tokenizer_len = _write_tokenizer(out_dir, special_ids)

    raw: dict[str, Any] = {"model_type": model_type, "architectures": [_ARCHITECTURES[model_type]]}
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

    gen = torch.Generator().manual_seed(seed)
    std = float(raw.get("initializer_range", 0.02))
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in sorted(hf_tensor_shapes(config).items()):
        noise = torch.randn(shape, generator=gen)
        if name.endswith("norm.weight") or ".post_norm" in name:
            tensors[name] = 1.0 + 0.1 * noise  # near one, but not one, so a missed norm shows
        elif name.endswith(".bias"):
            tensors[name] = 0.1 * noise
        else:
            tensors[name] = std * noise
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    (out_dir / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    generation = {k: raw[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in raw}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    return out_dir


def _write_tokenizer(out_dir: Path, special_ids: dict[str, int]) -> int:
    """Tokenizer length, or 0 when the tiny tokenizer is not available."""
    try:
        from gpu_workers.tiny_tokenizer import build_tiny_tokenizer
    except ImportError:
        return 0
    length = build_tiny_tokenizer(out_dir)
    vocab = json.loads((out_dir / "tokenizer.json").read_text())["added_tokens"]
    special_ids.update({t["content"]: t["id"] for t in vocab})
    return length


def default_checkpoint_dir(cache_root: Path | None = None) -> Path:
    """The default tiny hyperclovax checkpoint, built once per version under the cache root
    (cache_root, else $OMNI_SERVE_CACHE, else ~/.cache/omni-serve)."""
    root = cache_root or Path(os.environ.get("OMNI_SERVE_CACHE") or Path.home() / ".cache" / "omni-serve")
    final = Path(root) / f"tiny-{TINY_CHECKPOINT_VERSION}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: readers never see a half-written directory, and
    # of two racing builders the second rename fails and its copy is dropped.
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        make_tiny_checkpoint(tmp, "hyperclovax", seed=0)
        os.rename(tmp, final)
    except OSError:
        if not (final / "config.json").is_file():
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m gpu_workers.tiny_checkpoints", description=__doc__)
    p.add_argument("--print-default-dir", action="store_true", help="build (once) and print the default checkpoint")
    p.add_argument("--out", type=Path, help="write a checkpoint here instead")
    p.add_argument("--model-type", default="hyperclovax", choices=SUPPORTED_MODEL_TYPES)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.out is not None:
        print(make_tiny_checkpoint(args.out, args.model_type, seed=args.seed))
    elif args.print_default_dir:
        print(default_checkpoint_dir())
    else:
        p.error("give --print-default-dir or --out")


if __name__ == "__main__":
    main()
