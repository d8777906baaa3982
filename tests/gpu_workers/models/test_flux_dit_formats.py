"""The DiT read from the reference's VisionTransformer folder (the published transformer/ and
transformer2/) against diffusers' Flux single-stream model (FluxTransformer2DModel with
num_layers=0 double-stream blocks), on tiny random float32 weights, in both use_patchify modes.

diffusers' weights are written under the reference's names by a mapping written here, from
the reference's modules (pipeline.py: linear1 rows [q | k | v | mlp], LastLayer's
adaLN_modulation chunked (shift, scale) where diffusers' norm_out chunks (scale, shift)), so
our renames on load are checked against an independent statement of them. Worst difference
measured: 0.0 in both modes (bit-identical on a CPU: the same float32 operations in the same
order; outputs up to 29 in magnitude), asserted under 1e-4 so that another backend may round.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import FluxTransformer2DModel
from safetensors.torch import save_file

from gpu_workers.models.flux_dit import FluxDiT, FluxDiTConfig, position_ids

GRID = (4, 6)  # the token grid
LATENT, COND, VEC, TEXT_DIM = 4, 6, 5, 8
DiffusersFlux = Any  # diffusers' models, typed Any: mypy cannot see through their mixins


def vision_transformer_config(use_patchify: bool, blocks: int = 2) -> dict[str, Any]:
    return {
        "_class_name": "VisionTransformer",
        "_diffusers_version": "0.32.2",
        "in_channels": 4 * LATENT if use_patchify else LATENT,  # the reference counts packed channels
        "context_in_dim": COND,
        "vec_in_dim": VEC,
        "hidden_size": 32,
        "mlp_ratio": 4.0,
        "num_heads": 2,
        "depth": 0,
        "depth_single_blocks": blocks,
        "axes_dim": [4, 6, 6],
        "theta": 10000,
        "qkv_bias": True,
        "guidance_embed": False,
        "use_patchify": use_patchify,
    }


def diffusers_model(use_patchify: bool) -> DiffusersFlux:
    """The Flux model that computes what the reference's VisionTransformer computes: its
    x_embedder takes the whole token (latent share + condition), proj_out gives the latent's."""
    latent_share = 4 * LATENT if use_patchify else LATENT
    torch.manual_seed(0)
    model: DiffusersFlux = FluxTransformer2DModel(
        in_channels=latent_share + COND,
        out_channels=latent_share,
        num_layers=0,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=TEXT_DIM,
        pooled_projection_dim=VEC,
        axes_dims_rope=(4, 6, 6),
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)  # norm scales too: a misplaced row shows
    return model.eval()


def to_reference_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' FluxTransformer2DModel (no double blocks) -> the reference's VisionTransformer."""
    out = {
        "img_in.weight": state["x_embedder.weight"],
        "img_in.bias": state["x_embedder.bias"],
        "final_layer.linear.weight": state["proj_out.weight"],
        "final_layer.linear.bias": state["proj_out.bias"],
    }
    for ours, theirs in (("time_in", "timestep_embedder"), ("vector_in", "text_embedder")):
        for layer, linear in (("in_layer", "linear_1"), ("out_layer", "linear_2")):
            for p in ("weight", "bias"):
                out[f"{ours}.{layer}.{p}"] = state[f"time_text_embed.{theirs}.{linear}.{p}"]
    for p in ("weight", "bias"):
        scale, shift = state[f"norm_out.linear.{p}"].chunk(2)
        out[f"final_layer.adaLN_modulation.1.{p}"] = torch.cat((shift, scale))
    blocks = {int(k.split(".")[1]) for k in state if k.startswith("single_transformer_blocks.")}
    for i in blocks:
        b = f"single_transformer_blocks.{i}."
        for p in ("weight", "bias"):
            out[f"single_blocks.{i}.modulation.lin.{p}"] = state[b + f"norm.linear.{p}"]
            parts = [state[b + f"{name}.{p}"] for name in ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")]
            out[f"single_blocks.{i}.linear1.{p}"] = torch.cat(parts)
            out[f"single_blocks.{i}.linear2.{p}"] = state[b + f"proj_out.{p}"]
        out[f"single_blocks.{i}.norm.query_norm.scale"] = state[b + "attn.norm_q.weight"]
        out[f"single_blocks.{i}.norm.key_norm.scale"] = state[b + "attn.norm_k.weight"]
    return out


def write_folder(path: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor], shards: int = 1) -> Path:
    """A VisionTransformer folder as diffusers' save_pretrained leaves it: one file, or shards
    and an index."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, str(path / "diffusion_pytorch_model.safetensors"))
        return path
    names = sorted(tensors)
    weight_map: dict[str, str] = {}
    for k in range(shards):
        file = f"diffusion_pytorch_model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = names[k::shards]
        save_file({n: tensors[n] for n in part}, str(path / file))
        weight_map |= dict.fromkeys(part, file)
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (path / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    return path


@pytest.mark.parametrize("use_patchify", [False, True])
def test_published_weights_compute_diffusers_flux(tmp_path: Path, use_patchify: bool) -> None:
    reference = diffusers_model(use_patchify)
    state = to_reference_names(reference.state_dict())
    folder = write_folder(tmp_path / "transformer", vision_transformer_config(use_patchify), state)
    ours = FluxDiT.from_dir(folder)
    c = ours.config
    assert (c.patch, c.pack_condition, c.in_channels) == ((2, False, LATENT) if use_patchify else (1, True, LATENT))
    assert c.token_in_dim == reference.config.in_channels and c.token_out_dim == reference.config.out_channels

    torch.manual_seed(1)
    x = torch.randn(2, GRID[0] * GRID[1], c.token_in_dim)
    vec = torch.randn(2, VEC)
    sigma = torch.tensor([0.25, 0.813])
    ids = position_ids(*GRID)
    with torch.no_grad():
        (want,) = reference(
            hidden_states=x,
            encoder_hidden_states=torch.zeros(2, 0, TEXT_DIM),
            pooled_projections=vec,
            timestep=sigma,
            img_ids=ids.float(),
            txt_ids=torch.zeros(0, 3),
            return_dict=False,
        )
        got = ours(x, ids, sigma * 1000, vec)
    assert got.shape == want.shape
    assert want.abs().max().item() > 1.0  # a live output
    worst = (got - want).abs().max().item()
    assert worst < 1e-4, worst

    # the same tensors in two shards and an index load to the same model
    sharded = FluxDiT.from_dir(write_folder(tmp_path / "sharded", vision_transformer_config(use_patchify), state, 2))
    with torch.no_grad():
        assert torch.equal(sharded(x, ids, sigma * 1000, vec), got)


def test_vision_transformer_config() -> None:
    # the reference class's defaults are the published sizes, which are our defaults
    assert FluxDiTConfig.from_dict({"_class_name": "VisionTransformer"}) == FluxDiTConfig()
    packed = FluxDiTConfig.from_dict(vision_transformer_config(True))
    assert (packed.in_channels, packed.patch, packed.pack_condition) == (LATENT, 2, False)
    assert (packed.token_in_dim, packed.token_out_dim) == (4 * LATENT + COND, 4 * LATENT)
    assert (packed.num_layers, packed.rope_theta, packed.axes_dims_rope) == (2, 10000.0, (4, 6, 6))
    ours_packed = FluxDiTConfig.from_dict(packed.to_dict())  # our config.json keeps the mode
    assert ours_packed == packed
    # our own patch-2 layout packs the condition too, and old configs without the key mean that
    assert FluxDiTConfig.from_dict({"patch": 2}).token_in_dim == 4 * (16 + 1536)

    with pytest.raises(ValueError, match="depth 1"):
        FluxDiTConfig.from_dict({**vision_transformer_config(False), "depth": 1})
    with pytest.raises(ValueError, match="in_channels 18"):
        FluxDiTConfig.from_dict({**vision_transformer_config(True), "in_channels": 18})
    with pytest.raises(ValueError, match="use_patchify"):
        FluxDiTConfig.from_dict({**vision_transformer_config(True), "use_patchify": "yes"})


def test_a_missing_or_extra_reference_weight_is_named(tmp_path: Path) -> None:
    state = to_reference_names(diffusers_model(False).state_dict())
    model = FluxDiT(FluxDiTConfig.from_dict(vision_transformer_config(False)))
    with pytest.raises(ValueError, match="blocks.1.k_norm.weight"):
        model.load_weights({k: v for k, v in state.items() if k != "single_blocks.1.norm.key_norm.scale"})
    with pytest.raises(ValueError, match="unexpected.*pe_embedder.x"):
        model.load_weights({**state, "pe_embedder.x": torch.zeros(1)})
