"""A deterministic tiny omni checkpoint in the published HyperCLOVAX-SEED-Omni-8B layout.

The layout is the download's (../shared/PUBLISHED_CHECKPOINT.md, omni/model_layout.py): a root
config.json nesting text_config / vision_config / audio_config, tokenizer files and the vision
preprocessor_config.json at the root, one safetensors set in two shards whose keys carry the
component prefixes (the LLM's and the encoders' tensors mixed in both shards, as in the real
download), decoder/vision/ (a diffusers folder) and decoder/audio/ (two TorchServe archives).

Key names below each prefix are those of the reference's modules; sizes are reduced. Tensors
the server never reads are written too (TA-Tok's reconstruction half, the MambaMia
video-audio compressor), so a test sees them skipped rather than absent.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from gpu_workers.models.llama import SUPPORTED_MODEL_TYPES
from gpu_workers.models.s3_tokenizer import S3TokenizerV2Config, random_reference_state_dict
from gpu_workers.tiny.checkpoints import (
    _BASE,
    TINY_AUDIO_ENCODER,
    TINY_VISION_ENCODER,
    TINY_VISION_PREPROCESSOR,
    _random_tensors,
    make_tiny_audio_encoder,
    make_tiny_checkpoint,
    make_tiny_component_checkpoint,
    make_tiny_vision_encoder,
)
from gpu_workers.tiny.published_audio_decoder import make_tiny_published_audio_decoder
from gpu_workers.tiny.published_vision_decoder import make_tiny_published_vision_decoder

# Bump when the default checkpoint's bytes change, so caches built by older code are not reused.
TINY_CHECKPOINT_VERSION = "omni-v7"
SHARDS = 2
# TA-Tok at reduced size: a SigLIP tower of width 144 (two heads of so400m's 72), 8 x 8 patches of
# 14 (64 codes a picture, as the tiny vocabulary has image code tokens), a 64-row SimVQ codebook.
TINY_TA_TOK = {"hidden": 144, "intermediate": 96, "layers": 3, "patch": 14, "grid": 8, "bottleneck": 16, "codes": 64}
# The reference's voice names (its docker-compose and examples): fkms is its default.
TINY_PUBLISHED_VOICES = ("fkms", "mhwj", "fphj", "mphw")
TINY_S3_FSQ_DIMS = 4  # 3 ** 4 = 81 audio units, the tiny vocabulary's audio unit tokens


def ta_tok_shapes(t: dict[str, int] = TINY_TA_TOK) -> dict[str, tuple[int, ...]]:
    """model.discrete_vision_model.* below the prefix, at the given sizes (section 3.4)."""
    h, i, b = t["hidden"], t["intermediate"], t["bottleneck"]
    shapes: dict[str, tuple[int, ...]] = {
        "encoder.embeddings.patch_embedding.weight": (h, 3, t["patch"], t["patch"]),
        "encoder.embeddings.patch_embedding.bias": (h,),
        "encoder.embeddings.position_embedding.weight": (t["grid"] ** 2, h),
        "encoder.post_layernorm.weight": (h,),
        "encoder.post_layernorm.bias": (h,),
        "encoder.head.probe": (1, 1, h),
        "encoder.head.attention.in_proj_weight": (3 * h, h),
        "encoder.head.attention.in_proj_bias": (3 * h,),
        "encoder.head.attention.out_proj.weight": (h, h),
        "encoder.head.attention.out_proj.bias": (h,),
        "encoder.head.layernorm.weight": (h,),
        "encoder.head.layernorm.bias": (h,),
        "encoder.head.mlp.fc1.weight": (i, h),
        "encoder.head.mlp.fc1.bias": (i,),
        "encoder.head.mlp.fc2.weight": (h, i),
        "encoder.head.mlp.fc2.bias": (h,),
        "encode_task_layer.0.weight": (h, h),
        "encode_task_layer.0.bias": (h,),
        "bottleneck.in_linear.weight": (b, h),
        "bottleneck.in_linear.bias": (b,),
        "bottleneck.out_linear.weight": (b, b),
        "bottleneck.out_linear.bias": (b,),
        "bottleneck.regularizer.embedding.weight": (t["codes"], b),
        "bottleneck.regularizer.embedding_proj.weight": (b, b),
        "bottleneck.regularizer.embedding_proj.bias": (b,),
        "decode_task_layer.0.weight": (h, h),
        "decode_task_layer.0.bias": (h,),
        "decode_task_layer.2.weight": (h, h),
        "decode_task_layer.2.bias": (h,),
        "decoder.vision_model.post_layernorm.weight": (h,),
        "decoder.vision_model.post_layernorm.bias": (h,),
        "scale_layer.shift": (1, 3, 1, 1),
        "scale_layer.scale": (1, 3, 1, 1),
    }
    for n in range(t["layers"]):
        p = f"encoder.encoder.layers.{n}."
        for norm in ("layer_norm1", "layer_norm2"):
            shapes |= {p + norm + ".weight": (h,), p + norm + ".bias": (h,)}
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes |= {p + f"self_attn.{proj}.weight": (h, h), p + f"self_attn.{proj}.bias": (h,)}
        shapes |= {p + "mlp.fc1.weight": (i, h), p + "mlp.fc1.bias": (i,)}
        shapes |= {p + "mlp.fc2.weight": (h, i), p + "mlp.fc2.bias": (h,)}
    return shapes


def tiny_ta_tok(seed: int) -> dict[str, torch.Tensor]:
    tensors = _random_tensors(ta_tok_shapes(), seed, 0.1)
    tensors["bottleneck.regularizer.embedding.weight"] = tensors["bottleneck.regularizer.embedding.weight"] * 10
    eye = torch.eye(TINY_TA_TOK["bottleneck"])  # a projection near the identity keeps codes apart
    tensors["bottleneck.regularizer.embedding_proj.weight"] = eye + tensors["bottleneck.regularizer.embedding_proj.weight"]
    tensors["scale_layer.shift"] = torch.full((1, 3, 1, 1), 0.5)
    tensors["scale_layer.scale"] = torch.full((1, 3, 1, 1), 0.5)
    return tensors


def mamba_mia_shapes(width: int, inner: int = 32, chunk: int = 25) -> dict[str, tuple[int, ...]]:
    """model.video_audio_compressor.* (section 3.8) at a reduced width: present, never served."""
    heads, state = 2, 8
    d_inner = 2 * inner
    xbc = d_inner + 2 * state
    return {
        "input_proj.weight": (inner, width),
        "input_proj.bias": (inner,),
        "query_token": (inner,),
        "input_norm.weight": (inner,),
        "input_norm.bias": (inner,),
        "model.layers.0.norm.weight": (inner,),
        "model.layers.0.mixer.in_proj.weight": (d_inner + xbc + heads, inner),
        "model.layers.0.mixer.conv1d.weight": (xbc, 1, 4),
        "model.layers.0.mixer.conv1d.bias": (xbc,),
        "model.layers.0.mixer.dt_bias": (heads,),
        "model.layers.0.mixer.A_log": (heads,),
        "model.layers.0.mixer.D": (heads,),
        "model.layers.0.mixer.norm.weight": (d_inner,),
        "model.layers.0.mixer.out_proj.weight": (inner, d_inner),
        "model.layers.0.weight_fc.weight": (chunk, inner),
        "model.layers.0.weight_fc.bias": (chunk,),
        "model.layers.0.gate_fc.weight": (1, inner),
        "model.layers.0.gate_fc.bias": (1,),
        "model.norm_f.weight": (inner,),
        "output_proj.weight": (width, inner),
        "output_proj.bias": (width,),
    }


def _prefixed(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {prefix + k: v for k, v in tensors.items()}


def make_tiny_published_checkpoint(
    out_dir: Path, *, seed: int = 0, llm_overrides: dict[str, Any] | None = None
) -> Path:
    """Write the tiny published-layout checkpoint into out_dir; same seed, same bytes.
    llm_overrides: text_config keys (a larger LLM for start-up measurements)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    num_units = 3**TINY_S3_FSQ_DIMS
    hidden = int({**_BASE, **(llm_overrides or {})}["hidden_size"])
    tensors: dict[str, torch.Tensor] = {}
    with tempfile.TemporaryDirectory() as tmp:
        parts = Path(tmp)
        # the LLM (and the tokenizer it writes, which moves to the root)
        llm_dir = make_tiny_checkpoint(
            parts / "llm", "hyperclovax", seed=seed, num_audio_codes=num_units, **(llm_overrides or {})
        )
        text_config = json.loads((llm_dir / "config.json").read_text())
        for name, tensor in load_file(llm_dir / "model.safetensors").items():
            # model.X -> model.language_model.model.X; lm_head.weight -> model.language_model.lm_head.weight
            tensors["model.language_model." + name] = tensor
        for path in llm_dir.iterdir():
            # no chat template: the server then speaks the reference's own format (track_b)
            if path.name not in ("config.json", "model.safetensors", "chat_template.jinja"):
                path.replace(out_dir / path.name)
        # the Qwen2.5-VL ViT and its projector
        vision_dir = make_tiny_vision_encoder(parts / "vision", seed=seed + 1, projector_hidden_size=hidden)
        for name, tensor in load_file(vision_dir / "model.safetensors").items():
            if name.startswith("projector."):
                tensors["model.mm_projector." + name[len("projector.") :]] = tensor
            else:
                tensors["model.vision_model." + name] = tensor
        # the Qwen2-Audio encoder and its fc1 / GELU / fc2 projector
        audio_dir = make_tiny_audio_encoder(parts / "audio", seed=seed + 2, projector_hidden_size=hidden)
        projector = {"projector.0.": "model.audio_projector.fc1.", "projector.2.": "model.audio_projector.fc2."}
        for name, tensor in load_file(audio_dir / "model.safetensors").items():
            new = next((p + name[len(o) :] for o, p in projector.items() if name.startswith(o)), None)
            tensors[new or "model.audio_model." + name] = tensor
    tensors |= _prefixed("model.discrete_vision_model.", tiny_ta_tok(seed + 3))
    s3 = S3TokenizerV2Config(n_mels=128, n_state=128, n_head=2, n_layer=2, fsq_dims=TINY_S3_FSQ_DIMS)
    tensors |= _prefixed("model.discrete_audio_model.", random_reference_state_dict(s3, seed + 4))
    tensors |= _prefixed("model.video_audio_compressor.", _random_tensors(mamba_mia_shapes(hidden), seed + 7, 0.1))

    vision_config = {k: v for k, v in TINY_VISION_ENCODER.items() if k != "model_type"}
    config: dict[str, Any] = {
        "model_type": "vlm",
        "architectures": ["HCXVisionV2ForCausalLM"],
        "text_config": text_config,
        "vision_config": {"model_type": "qwen2_5_vl", **vision_config, "out_hidden_size": vision_config["out_hidden_size"]},
        "audio_config": dict(TINY_AUDIO_ENCODER),
        "hidden_size": hidden,
        "torch_dtype": "float32",
    }
    # decoder/vision/: the DiT draws from the image tokenizer's codebook, folded as the encoder
    # worker folds it (the reference's token_embedder is its own table of the same shape)
    ta = {k[len("model.discrete_vision_model.bottleneck.regularizer.") :]: v for k, v in tensors.items()
          if k.startswith("model.discrete_vision_model.bottleneck.regularizer.")}
    codebook = ta["embedding.weight"] @ ta["embedding_proj.weight"].T + ta["embedding_proj.bias"]
    grid = (TINY_TA_TOK["grid"], TINY_TA_TOK["grid"])
    make_tiny_published_vision_decoder(out_dir / "decoder" / "vision", seed=seed + 5, codebook=codebook, code_grid=grid)
    make_tiny_published_audio_decoder(
        out_dir / "decoder" / "audio", seed=seed + 6, num_units=num_units, voices=TINY_PUBLISHED_VOICES
    )
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "preprocessor_config.json", TINY_VISION_PREPROCESSOR)
    save_sharded(out_dir, tensors, SHARDS)
    return out_dir


def save_sharded(out_dir: Path, tensors: dict[str, torch.Tensor], shards: int) -> None:
    """model-0000k-of-0000n.safetensors + model.safetensors.index.json, names dealt in sorted
    order so each shard holds several components' tensors, as the real download's do."""
    names = sorted(tensors)
    per = math.ceil(len(names) / shards)
    weight_map: dict[str, str] = {}
    total = 0
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[k * per : (k + 1) * per]}
        save_file(part, str(out_dir / file), metadata={"format": "pt"})
        weight_map |= {n: file for n in part}
        total += sum(t.numel() * t.element_size() for t in part.values())
    _write_json(out_dir / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def make_tiny_omni_checkpoint(out_dir: Path, *, seed: int = 0) -> Path:
    """The embedded default: a tiny omni checkpoint in the published layout, as users download
    the real one (gpu_workers/tiny/published.py)."""
    return make_tiny_published_checkpoint(out_dir, seed=seed)


# The embedded default's generation defaults: no reasoning block. The reference's template opens
# <think> and random weights rarely close it, so a turn would be all reasoning: no text to speak,
# no image drawn. A request's reasoning_effort (low and up) or chat_template_kwargs still open it.
EMBEDDED_GENERATION_DEFAULTS = {"default_chat_template_kwargs": {"skip_reasoning": True, "enable_thinking": False}}


def make_embedded_default(out_dir: Path) -> Path:
    """What a bare omni-serve serves: the tiny omni checkpoint (seed 0) with the generation
    defaults above, its config marked random_weights (the playground then opens chat on a
    trained model served beside it). make_tiny_omni_checkpoint alone thinks by default, as the
    reference model does."""
    make_tiny_omni_checkpoint(out_dir, seed=0)
    for name, extra in (("generation_config.json", EMBEDDED_GENERATION_DEFAULTS), ("config.json", {"random_weights": True})):
        _write_json(out_dir / name, json.loads((out_dir / name).read_text()) | extra)
    return out_dir


def default_checkpoint_dir(cache_root: Path | None = None) -> Path:
    """The default tiny omni checkpoint (make_embedded_default), built once per version under
    the cache root (cache_root, else $OMNI_SERVE_CACHE, else ~/.cache/omni-serve)."""
    root = cache_root or Path(os.environ.get("OMNI_SERVE_CACHE") or Path.home() / ".cache" / "omni-serve")
    final = Path(root) / f"tiny-{TINY_CHECKPOINT_VERSION}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: readers never see a half-written directory, and
    # of two racing builders the second rename fails and its copy is dropped.
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        make_embedded_default(tmp)
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

    p = argparse.ArgumentParser(prog="python -m gpu_workers.tiny.published", description=__doc__)
    p.add_argument("--print-default-dir", action="store_true", help="build (once) and print the default checkpoint")
    p.add_argument("--out", type=Path, help="write a checkpoint here instead")
    p.add_argument("--model-type", default="hyperclovax", choices=(*SUPPORTED_MODEL_TYPES, "omni", "omni-components"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.out is not None:
        if args.model_type == "omni":
            print(make_tiny_omni_checkpoint(args.out, seed=args.seed))
        elif args.model_type == "omni-components":
            print(make_tiny_component_checkpoint(args.out, seed=args.seed))
        else:
            print(make_tiny_checkpoint(args.out, args.model_type, seed=args.seed))
    elif args.print_default_dir:
        print(default_checkpoint_dir())
    else:
        p.error("give --print-default-dir or --out")


if __name__ == "__main__":
    main()
