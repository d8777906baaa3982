"""The image decoder's single-stream DiT against diffusers' Flux, on tiny random float32
weights: one block, the whole model (no double-stream blocks, zero text tokens), the
embeddings, the packing helpers, the sharded forward and the code condition."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from diffusers import FluxPipeline, FluxTransformer2DModel
from diffusers.models.embeddings import Timesteps, apply_rotary_emb, get_timestep_embedding
from diffusers.models.transformers.transformer_flux import FluxPosEmbed, FluxSingleTransformerBlock
from safetensors.torch import save_file

from gpu_workers.models.flux_dit import (
    FluxDiT,
    FluxDiTConfig,
    SingleStreamBlock,
    apply_rope,
    condition_from_codes,
    patchify,
    position_ids,
    rope_cos_sin,
    timestep_embedding,
    unpatchify,
)
from gpu_workers.models.flux_dit_formats import diffusers_state_dict_to_ours

# head_dim 16 = 4 + 6 + 6; a 8 x 12 latent packs into a 4 x 6 grid of 24 tokens
CONFIG = FluxDiTConfig(
    in_channels=4,
    cond_channels=6,
    hidden_size=32,
    num_heads=2,
    num_layers=2,
    axes_dims_rope=(4, 6, 6),
    vec_in_dim=5,
    patch=2,  # packed as diffusers' Flux pipeline packs, so its configs map onto ours
)
GRID = (4, 6)
TEXT_DIM = 8  # diffusers' context_embedder width; it sees no tokens
# diffusers' models, typed Any: mypy cannot see through their lazy-import and mixin layers
DiffusersFlux = Any


def randomize(module: torch.nn.Module) -> None:
    """Every weight random and of order one (norm scales too), so a misplaced row shows."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)


@pytest.fixture(scope="module")
def reference() -> DiffusersFlux:
    torch.manual_seed(0)
    model: DiffusersFlux = FluxTransformer2DModel(
        in_channels=CONFIG.token_in_dim,
        out_channels=CONFIG.token_out_dim,
        num_layers=0,
        num_single_layers=CONFIG.num_layers,
        attention_head_dim=CONFIG.head_dim,
        num_attention_heads=CONFIG.num_heads,
        joint_attention_dim=TEXT_DIM,
        pooled_projection_dim=CONFIG.vec_in_dim,
        axes_dims_rope=CONFIG.axes_dims_rope,
    )
    randomize(model)
    return model.eval()


@pytest.fixture(scope="module")
def ours(reference: DiffusersFlux) -> FluxDiT:
    model = FluxDiT(CONFIG).eval()
    model.load_weights(reference.state_dict())
    return model


def inputs(batch: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    x = torch.randn(batch, GRID[0] * GRID[1], CONFIG.token_in_dim)
    vec = torch.randn(batch, CONFIG.vec_in_dim)
    sigma = torch.tensor([0.25, 0.8125, 0.5])[:batch]
    return x, vec, sigma


def test_block_matches_diffusers() -> None:
    torch.manual_seed(2)
    theirs = FluxSingleTransformerBlock(CONFIG.hidden_size, CONFIG.num_heads, CONFIG.head_dim).eval()
    randomize(theirs)
    block = SingleStreamBlock(CONFIG).eval()
    # the block's names through the model-level mapping: in as block 0, out without "blocks.0."
    named = {f"single_transformer_blocks.0.{k}": v for k, v in theirs.state_dict().items()}
    mapped = diffusers_state_dict_to_ours(named)
    block.load_state_dict({k.removeprefix("blocks.0."): v for k, v in mapped.items()}, strict=True)

    x = torch.randn(2, 24, CONFIG.hidden_size)
    temb = torch.randn(2, CONFIG.hidden_size)
    ids = position_ids(*GRID)
    with torch.no_grad():
        _, want = theirs(
            hidden_states=x,
            encoder_hidden_states=x[:, :0],
            temb=temb,
            image_rotary_emb=FluxPosEmbed(10000, list(CONFIG.axes_dims_rope))(ids.float()),
        )
        got = block(x, temb, rope_cos_sin(ids, CONFIG.axes_dims_rope, 10000.0), F.scaled_dot_product_attention)
    assert (got - want).abs().max().item() < 1e-4


def test_dit_matches_diffusers(reference: DiffusersFlux, ours: FluxDiT) -> None:
    x, vec, sigma = inputs()
    ids = position_ids(*GRID)
    with torch.no_grad():
        # zero text tokens: the joint sequence is the image alone, so the model is single-stream
        (want,) = reference(
            hidden_states=x,
            encoder_hidden_states=torch.zeros(2, 0, TEXT_DIM),
            pooled_projections=vec,
            timestep=sigma,
            img_ids=ids.float(),
            txt_ids=torch.zeros(0, 3),
            return_dict=False,
        )
        # diffusers scales sigma by 1000 inside; ours takes the scaled value
        got = ours(x, ids, sigma * 1000, vec)
    assert got.shape == (2, 24, CONFIG.token_out_dim)
    assert want.abs().max().item() > 1.0  # a live output, not a collapsed one
    assert (got - want).abs().max().item() < 1e-4


def test_timestep_embedding_matches_diffusers() -> None:
    t = torch.tensor([0.0, 1.0, 37.5, 250.0, 999.0, 1000.0])
    got = timestep_embedding(t)
    want = Timesteps(num_channels=256, flip_sin_to_cos=True, downscale_freq_shift=0)(t)
    assert got.shape == (6, 256)
    assert (got - want).abs().max().item() < 1e-6
    direct = get_timestep_embedding(t, 256, flip_sin_to_cos=True, downscale_freq_shift=0)
    assert (got - direct).abs().max().item() < 1e-6


def test_rope_matches_diffusers() -> None:
    torch.manual_seed(3)
    # every axis non-zero and some positions large, where float32 angles would drift
    ids = torch.randint(0, 4096, (50, 3))
    cos, sin = rope_cos_sin(ids, CONFIG.axes_dims_rope, 10000.0)
    want_cos, want_sin = FluxPosEmbed(10000, list(CONFIG.axes_dims_rope))(ids.float())
    assert cos.shape == (50, CONFIG.head_dim)
    assert (cos - want_cos).abs().max().item() < 1e-6
    assert (sin - want_sin).abs().max().item() < 1e-6
    q = torch.randn(2, 50, CONFIG.num_heads, CONFIG.head_dim)  # (B, S, H, D)
    want: torch.Tensor = apply_rotary_emb(q, (want_cos, want_sin), sequence_dim=1)  # type: ignore[arg-type,assignment]
    assert (apply_rope(q, cos, sin) - want).abs().max().item() < 1e-6


def test_sharded_forward_equals_unsharded(ours: FluxDiT) -> None:
    """Uneven shards of shuffled tokens, one thread per shard, with an attention that gathers
    every shard's keys and values: each shard's rows equal the unsharded forward's."""
    x, vec, sigma = inputs()
    ids = position_ids(*GRID)
    with torch.no_grad():
        full = ours(x, ids, sigma * 1000, vec)

    torch.manual_seed(4)
    order = torch.randperm(ids.shape[0])
    shards = list(order.split([11, 8, 5]))  # token indices of each rank
    slots: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(shards)
    barrier = threading.Barrier(len(shards), timeout=120)  # a hang guard

    def run(rank: int) -> torch.Tensor:
        def gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            slots[rank] = (k, v)
            barrier.wait()  # every rank's k, v of this layer are in
            k_all = torch.cat([s[0] for s in slots if s is not None], dim=2)  # (B, H, S, D)
            v_all = torch.cat([s[1] for s in slots if s is not None], dim=2)
            out = F.scaled_dot_product_attention(q, k_all, v_all)
            barrier.wait()  # nobody overwrites a slot while another rank still reads it
            return out

        index = shards[rank]
        with torch.no_grad():
            return ours(x[:, index], ids[index], sigma * 1000, vec, attention=gather_attention)

    with ThreadPoolExecutor(len(shards)) as pool:
        outs = list(pool.map(run, range(len(shards))))
    # equal up to float rounding (SDPA over fewer query rows blocks its sums differently)
    scale = full.abs().max().item()
    for index, out in zip(shards, outs, strict=True):
        assert (out - full[:, index]).abs().max().item() < 1e-6 * scale


def test_condition_from_codes() -> None:
    torch.manual_seed(5)
    codebook = torch.randn(20, CONFIG.cond_channels)
    codes = torch.randint(0, 20, (2, 9))  # a 3 x 3 code grid, row-major
    cond, vec = condition_from_codes(codes, codebook, (8, 12))
    assert cond.shape == (2, CONFIG.cond_channels, 8, 12)
    assert vec.shape == (2, CONFIG.cond_channels)

    grid = torch.empty(2, CONFIG.cond_channels, 3, 3)
    for b in range(2):
        for i in range(3):
            for j in range(3):
                grid[b, :, i, j] = codebook[codes[b, i * 3 + j]]
    assert torch.equal(cond, F.interpolate(grid, size=(8, 12), mode="bilinear", align_corners=False))
    # align_corners=False clamps at the border: the corner pixels are the corner codes (the
    # far corner up to rounding: its weights are (1 - l, l) on two copies of one code)
    assert torch.equal(cond[:, :, 0, 0], codebook[codes[:, 0]])
    torch.testing.assert_close(cond[:, :, -1, -1], codebook[codes[:, 8]])
    torch.testing.assert_close(vec, codebook[codes].mean(dim=1))

    # one code everywhere: a constant map of its row
    same, _ = condition_from_codes(torch.full((1, 9), 7), codebook, (5, 7))
    torch.testing.assert_close(same, codebook[7][None, :, None, None].expand(1, -1, 5, 7))

    with pytest.raises(ValueError, match="square"):
        condition_from_codes(torch.zeros(1, 8, dtype=torch.long), codebook, (8, 8))
    with pytest.raises(ValueError, match="outside"):
        condition_from_codes(torch.full((1, 9), 20), codebook, (8, 8))


def test_packing_matches_the_flux_pipeline() -> None:
    latents = torch.randn(2, 10, 8, 12)
    tokens = patchify(latents)
    assert torch.equal(tokens, FluxPipeline._pack_latents(latents, 2, 10, 8, 12))
    # the pipeline's unpack takes the image size in pixels (8x the latent)
    assert torch.equal(unpatchify(tokens, 4, 6), FluxPipeline._unpack_latents(tokens, 64, 96, 8))
    assert torch.equal(unpatchify(tokens, 4, 6), latents)
    want_ids = FluxPipeline._prepare_latent_image_ids(2, 4, 6, "cpu", torch.float32)
    assert torch.equal(position_ids(4, 6).float(), want_ids)
    with pytest.raises(ValueError, match="divisible"):
        patchify(torch.randn(1, 4, 7, 8))


def test_config_from_diffusers_and_ours(reference: DiffusersFlux) -> None:
    assert FluxDiTConfig.from_dict(dict(reference.config)) == CONFIG
    assert FluxDiTConfig.from_dict(CONFIG.to_dict()) == CONFIG
    assert FluxDiTConfig.from_dict({}) == FluxDiTConfig()  # the reference decoder's sizes
    reference_size = FluxDiTConfig()  # unpacked, as the reference's DiT runs by default
    assert (reference_size.head_dim, reference_size.token_in_dim, reference_size.token_out_dim) == (80, 1552, 16)
    packed = FluxDiTConfig(patch=2)
    assert (packed.token_in_dim, packed.token_out_dim) == (6208, 64)
    with pytest.raises(ValueError, match="patch"):
        FluxDiTConfig(patch=3)

    with pytest.raises(ValueError, match="double-stream"):
        FluxDiTConfig.from_dict({**reference.config, "num_layers": 1})
    with pytest.raises(ValueError, match="out_channels"):
        FluxDiTConfig.from_dict({**reference.config, "out_channels": None})
    with pytest.raises(ValueError, match="head_dim"):
        FluxDiTConfig(hidden_size=32, num_heads=2, axes_dims_rope=(4, 6, 8))


def test_from_dir_reads_ours_and_diffusers(tmp_path: Path, reference: DiffusersFlux, ours: FluxDiT) -> None:
    x, vec, sigma = inputs(batch=1)
    ids = position_ids(*GRID)
    with torch.no_grad():
        want = ours(x, ids, sigma * 1000, vec)

    ours_dir = tmp_path / "ours"
    ours_dir.mkdir()
    (ours_dir / "config.json").write_text(json.dumps(CONFIG.to_dict()))
    save_file({k: v.contiguous() for k, v in ours.state_dict().items()}, str(ours_dir / "model.safetensors"))
    reference.save_pretrained(tmp_path / "diffusers")

    for path in (ours_dir, tmp_path / "diffusers"):
        model = FluxDiT.from_dir(path)
        assert model.config == CONFIG
        with torch.no_grad():
            assert torch.equal(model(x, ids, sigma * 1000, vec), want)

    partial = {k: v for k, v in reference.state_dict().items() if not k.endswith("attn.to_k.weight")}
    with pytest.raises(ValueError, match="lacks attn.to_k"):
        FluxDiT(CONFIG).load_weights(partial)
    with pytest.raises(ValueError, match="unexpected"):
        FluxDiT(CONFIG).load_weights({**ours.state_dict(), "extra.weight": torch.zeros(1)})


def test_one_token_per_latent_pixel_when_unpacked() -> None:
    """patch 1, the reference's default: a token is one latent pixel's channels, row-major."""
    latents = torch.randn(2, 5, 3, 4)
    tokens = patchify(latents, patch=1)
    assert torch.equal(tokens, latents.flatten(2).transpose(1, 2))
    assert torch.equal(unpatchify(tokens, 3, 4, patch=1), latents)
    config = FluxDiTConfig(in_channels=4, cond_channels=6, hidden_size=32, num_heads=2, num_layers=1, axes_dims_rope=(4, 6, 6), vec_in_dim=5)
    model = FluxDiT(config)
    out = model(torch.randn(1, 12, config.token_in_dim), position_ids(3, 4), torch.tensor([500.0]), torch.randn(1, 5))
    assert out.shape == (1, 12, 4)
