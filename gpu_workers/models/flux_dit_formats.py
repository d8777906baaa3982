"""FluxDiT's checkpoint formats: configs and weight names of our own folders, of diffusers'
FluxTransformer2DModel and of the reference's VisionTransformer (the published
decoder/vision/transformer/ and transformer2/), each turned into ours.

Weights. Our names (what our checkpoints hold, a tiny embedded one included) against
diffusers' FluxTransformer2DModel with num_layers=0 double-stream blocks:

    time_embed.linear_{1,2}        time_text_embed.timestep_embedder.linear_{1,2}
    vec_embed.linear_{1,2}         time_text_embed.text_embedder.linear_{1,2}
    x_embed                        x_embedder
    blocks.i.modulation            single_transformer_blocks.i.norm.linear  (shift, scale, gate)
    blocks.i.linear_in             rows: attn.to_q | attn.to_k | attn.to_v | proj_mlp
    blocks.i.q_norm, k_norm        attn.norm_q, attn.norm_k
    blocks.i.linear_out            proj_out  (input columns: attention | MLP)
    final.modulation               norm_out.linear, halves swapped: diffusers chunks
                                   (scale, shift), we chunk (shift, scale) like the blocks
    final.linear                   proj_out
    (none)                         context_embedder: it embeds text tokens, of which there
                                   are none; dropped at conversion

`FluxDiT.load_weights` takes any of the three namings; diffusers' is converted on load (one
concatenation per block), so a diffusers-format conversion of a real checkpoint drops in.
A weak "autoguidance" transformer is another FluxDiT with a smaller config.

The reference's VisionTransformer (the published decoder/vision/transformer/ and
transformer2/) stores the same tensors under other names, renamed on load with no other
change (its linear1 rows are [q | k | v | mlp], its modulations chunk (shift, scale, gate)
and (shift, scale), as ours):

    img_in                         x_embed
    time_in.{in,out}_layer         time_embed.linear_{1,2}
    vector_in.{in,out}_layer       vec_embed.linear_{1,2}
    single_blocks.i.modulation.lin blocks.i.modulation
    single_blocks.i.linear1        blocks.i.linear_in
    single_blocks.i.linear2        blocks.i.linear_out
    single_blocks.i.norm.query_norm.scale / key_norm.scale    blocks.i.q_norm / k_norm.weight
    final_layer.adaLN_modulation.1 final.modulation
    final_layer.linear             final.linear
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from gpu_workers.models.checkpoint_io import INDEX_FILE, SINGLE_FILE, load_safetensors, read_json

# the weights file of a folder saved by diffusers' save_pretrained, and its index when sharded
_DIFFUSERS_FILE = "diffusion_pytorch_model.safetensors"
_DIFFUSERS_INDEX = "diffusion_pytorch_model.safetensors.index.json"


# The reference's VisionTransformer.__init__ defaults (pipeline.py), for keys its config.json
# leaves out (diffusers' ConfigMixin writes every one, so this matters for hand-written files)
REFERENCE_CLASS = "VisionTransformer"
_REFERENCE_DEFAULTS: dict[str, Any] = {
    "in_channels": 16,
    "vec_in_dim": 1536,
    "context_in_dim": 1536,
    "hidden_size": 1920,
    "mlp_ratio": 4.0,
    "num_heads": 24,
    "depth": 0,
    "depth_single_blocks": 35,
    "axes_dim": (8, 36, 36),
    "theta": 10000,
    "qkv_bias": True,
    "guidance_embed": False,
    "use_patchify": False,
}


def reference_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The reference's VisionTransformer config.json -> FluxDiTConfig's fields:

        depth_single_blocks        num_layers      (depth: double-stream blocks, must be 0)
        context_in_dim             cond_channels
        vec_in_dim, hidden_size, num_heads, mlp_ratio     the same
        axes_dim, theta            axes_dims_rope, rope_theta
        use_patchify false         patch 1, in_channels = in_channels
        use_patchify true          patch 2, pack_condition false, in_channels = in_channels / 4

    With use_patchify the reference's in_channels counts the PACKED latent (img_in takes
    in_channels + context_in_dim and the final layer gives in_channels back, unpacked 2 x 2),
    so it must be 4 x the VAE's 16 latent channels. qkv_bias and guidance_embed are accepted
    and unused, as the reference's class ignores them (its linear1 always has a bias; it has
    no guidance embedder). depth > 0 is refused: the reference builds no double-stream blocks
    whatever its value, so a checkpoint saying otherwise is not one it would run as written."""
    c = {**_REFERENCE_DEFAULTS, **config}
    if c["depth"] != 0:
        raise ValueError(f"flux dit: VisionTransformer config has depth {c['depth']}; only 0 is supported")
    patchified = c["use_patchify"]
    if not isinstance(patchified, bool):
        raise ValueError(f"flux dit: VisionTransformer use_patchify must be true or false, got {patchified!r}")  # noqa: TRY004
    in_channels = c["in_channels"]
    if patchified and (not isinstance(in_channels, int) or in_channels % 4):
        raise ValueError(
            f"flux dit: VisionTransformer with use_patchify has in_channels {in_channels!r}, "
            "not 4 x the latent channels (the packed 2 x 2 latent)"
        )
    return {
        "in_channels": in_channels // 4 if patchified else in_channels,
        "cond_channels": c["context_in_dim"],
        "hidden_size": c["hidden_size"],
        "num_heads": c["num_heads"],
        "num_layers": c["depth_single_blocks"],
        "mlp_ratio": float(c["mlp_ratio"]),
        "axes_dims_rope": tuple(c["axes_dim"]),
        "rope_theta": float(c["theta"]),
        "vec_in_dim": c["vec_in_dim"],
        "patch": 2 if patchified else 1,
        "pack_condition": not patchified,
    }


# FluxTransformer2DModel.__init__ defaults, for keys a diffusers config.json leaves out
_DIFFUSERS_DEFAULTS: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 64,
    "out_channels": None,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "pooled_projection_dim": 768,
    "guidance_embeds": False,
    "axes_dims_rope": (16, 56, 56),
}


def diffusers_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """diffusers FluxTransformer2DModel config -> FluxDiTConfig's fields:

        num_single_layers                         num_layers
        num_attention_heads                       num_heads
        num_attention_heads * attention_head_dim  hidden_size
        pooled_projection_dim                     vec_in_dim
        out_channels / 4                          in_channels  (diffusers counts packed channels)
        in_channels / 4 - out_channels / 4        cond_channels
        axes_dims_rope                            axes_dims_rope
        (fixed 10000, 4.0 in diffusers)           rope_theta, mlp_ratio
        joint_attention_dim                       unused: it sizes context_embedder, for text tokens

    Refused: double-stream blocks (num_layers > 0), a guidance embedder, patch_size != 1
    (diffusers' own unpatchify in proj_out; Flux packs outside the model) and
    out_channels left unset (then it equals in_channels and leaves no room for a condition).
    """
    c = {**_DIFFUSERS_DEFAULTS, **config}
    if c["num_layers"] != 0:
        raise ValueError(f"flux dit: diffusers config has {c['num_layers']} double-stream blocks; only 0 is supported")
    if c["guidance_embeds"]:
        raise ValueError("flux dit: diffusers config has guidance_embeds; guidance distillation is not supported")
    if c["patch_size"] != 1:
        raise ValueError(f"flux dit: diffusers config has patch_size {c['patch_size']}; only 1 is supported")
    packed_in, packed_out = c["in_channels"], c["out_channels"]
    if not isinstance(packed_out, int) or packed_out % 4 or packed_in % 4 or packed_in <= packed_out:
        raise ValueError(
            f"flux dit: diffusers in_channels {packed_in} / out_channels {packed_out} must be packed "
            "(multiples of 4), with in_channels = 4 * (latent + condition) > out_channels = 4 * latent"
        )
    heads, head_dim = c["num_attention_heads"], c["attention_head_dim"]
    return {
        "in_channels": packed_out // 4,
        "cond_channels": (packed_in - packed_out) // 4,
        "hidden_size": heads * head_dim,
        "num_heads": heads,
        "num_layers": c["num_single_layers"],
        "axes_dims_rope": tuple(c["axes_dims_rope"]),
        "vec_in_dim": c["pooled_projection_dim"],
        "patch": 2,  # diffusers' Flux configs count packed channels
    }


def read_weights(path: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    """model.safetensors (sharded or not) or, in a folder saved by diffusers,
    diffusion_pytorch_model.safetensors (sharded or not); the tensors by their stored names."""
    ours = (path / SINGLE_FILE).is_file() or (path / INDEX_FILE).is_file()
    if not ours and (path / _DIFFUSERS_FILE).is_file():
        return load_file(path / _DIFFUSERS_FILE, device=str(device))
    if not ours and (path / _DIFFUSERS_INDEX).is_file():
        return _read_sharded(path / _DIFFUSERS_INDEX, device)
    return load_safetensors(path, device)


def _read_sharded(index: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    """Every tensor an index's weight_map names, from its shards (diffusers' save_pretrained
    above its shard size: diffusion_pytorch_model-0000k-of-0000n.safetensors)."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: no weight_map")
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if not (index.parent / shard).is_file():
            raise ValueError(f"{index}: shard file {shard} not found")
        tensors.update(load_file(index.parent / shard, device=str(device)))
    return tensors


# ---------------------------------------------------------------------------------------------
# diffusers FluxTransformer2DModel names -> ours (the table in the module docstring).

_DIFFUSERS_MARKERS = ("single_transformer_blocks.", "time_text_embed.", "x_embedder.", "norm_out.")
_DIFFUSERS_RENAMES = {
    "time_text_embed.timestep_embedder.": "time_embed.",
    "time_text_embed.text_embedder.": "vec_embed.",
    "x_embedder.": "x_embed.",
    "proj_out.": "final.linear.",
}
# rows of linear_in, in order
_LINEAR_IN_PARTS = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
_BLOCK_RENAMES = {
    "norm.linear.": "modulation.",
    "attn.norm_q.": "q_norm.",
    "attn.norm_k.": "k_norm.",
    "proj_out.": "linear_out.",
}


def diffusers_state_dict_to_ours(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename (and fuse) a FluxTransformer2DModel state dict with no double-stream blocks.
    context_embedder.* is dropped; a name with no counterpart is kept as it is, so that
    loading reports it as unexpected."""
    ours: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, torch.Tensor]] = {}  # "blocks.i.linear_in.weight" -> part -> tensor
    for name, tensor in state_dict.items():
        if name.startswith("context_embedder."):
            continue
        if name.startswith("norm_out.linear."):
            # diffusers' AdaLayerNormContinuous chunks (scale, shift); ours (shift, scale)
            scale, shift = tensor.chunk(2, dim=0)
            ours["final.modulation." + name.removeprefix("norm_out.linear.")] = torch.cat((shift, scale), dim=0)
            continue
        prefix = next((p for p in _DIFFUSERS_RENAMES if name.startswith(p)), None)
        if prefix is not None:
            ours[_DIFFUSERS_RENAMES[prefix] + name.removeprefix(prefix)] = tensor
            continue
        if name.startswith("single_transformer_blocks."):
            index, rest = name.removeprefix("single_transformer_blocks.").split(".", 1)
            part, _, param = rest.rpartition(".")
            if part in _LINEAR_IN_PARTS:
                fused.setdefault(f"blocks.{index}.linear_in.{param}", {})[part] = tensor
                continue
            block_prefix = next((p for p in _BLOCK_RENAMES if rest.startswith(p)), None)
            if block_prefix is not None:
                ours[f"blocks.{index}.{_BLOCK_RENAMES[block_prefix]}{rest.removeprefix(block_prefix)}"] = tensor
                continue
        ours[name] = tensor
    for target, parts in fused.items():
        missing = [p for p in _LINEAR_IN_PARTS if p not in parts]
        if missing:
            raise ValueError(f"flux dit weights: {target} lacks {', '.join(missing)}")
        ours[target] = torch.cat([parts[p] for p in _LINEAR_IN_PARTS], dim=0)
    return ours


# ---------------------------------------------------------------------------------------------
# The reference's VisionTransformer names -> ours: renames only (same fused linear1 rows, same
# modulation chunk orders), so every tensor is loaded as stored.

_REFERENCE_MARKERS = ("single_blocks.", "img_in.", "time_in.", "vector_in.", "final_layer.")
_REFERENCE_RENAMES = {
    "img_in.": "x_embed.",
    "time_in.in_layer.": "time_embed.linear_1.",
    "time_in.out_layer.": "time_embed.linear_2.",
    "vector_in.in_layer.": "vec_embed.linear_1.",
    "vector_in.out_layer.": "vec_embed.linear_2.",
    "final_layer.linear.": "final.linear.",
    "final_layer.adaLN_modulation.1.": "final.modulation.",  # Sequential(SiLU, Linear)
}
_REFERENCE_BLOCK_RENAMES = {
    "modulation.lin.": "modulation.",
    "linear1.": "linear_in.",
    "linear2.": "linear_out.",
    "norm.query_norm.scale": "q_norm.weight",
    "norm.key_norm.scale": "k_norm.weight",
}


def reference_state_dict_to_ours(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a VisionTransformer state dict. A name with no counterpart is kept as it is, so
    that loading reports it as unexpected."""
    ours: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        prefix = next((p for p in _REFERENCE_RENAMES if name.startswith(p)), None)
        if prefix is not None:
            ours[_REFERENCE_RENAMES[prefix] + name.removeprefix(prefix)] = tensor
            continue
        if name.startswith("single_blocks."):
            index, rest = name.removeprefix("single_blocks.").split(".", 1)
            block_prefix = next((p for p in _REFERENCE_BLOCK_RENAMES if rest.startswith(p)), None)
            if block_prefix is not None:
                renamed = _REFERENCE_BLOCK_RENAMES[block_prefix] + rest.removeprefix(block_prefix)
                ours[f"blocks.{index}.{renamed}"] = tensor
                continue
        ours[name] = tensor
    return ours


def state_dict_to_ours(state_dict: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
    """Any of the three namings -> ours (ours passes through)."""
    if any(name.startswith(_REFERENCE_MARKERS) for name in state_dict):
        return reference_state_dict_to_ours(state_dict)
    if any(name.startswith(_DIFFUSERS_MARKERS) for name in state_dict):
        return diffusers_state_dict_to_ours(state_dict)
    return state_dict
