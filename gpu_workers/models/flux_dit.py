"""Flux-style single-stream DiT: the image decoder's denoiser.

One denoising step, for a latent of h x w (the image's size / 8, the VAE's factor) and a
token grid of gh x gw = h/2 x w/2 (a 768 x 768 image: 96 x 96 latent, 48 x 48 = 2,304 tokens):

    condition_from_codes(codes, codebook, (h, w))   (B, cond, h, w) map, (B, cond) vec
    cat([noisy latent, cond map], channels)         (B, in + cond, h, w)
    patchify                                        (B, gh*gw, 4*(in + cond)) tokens
    FluxDiT(tokens, position_ids(gh, gw), t, vec)   (B, gh*gw, 4*in) velocity tokens
    unpatchify(velocity, gh, gw)                    (B, in, h, w)

The condition: each code's codebook row (cond_channels wide), laid out on the code grid
(27 x 27, row-major, as TA-Tok emits them), bilinearly resized to the latent grid (h, w)
with align_corners=False (torch's default) and concatenated after the latent channels.
Resizing happens at latent resolution, before the 2x2 packing, so each token carries
2x2 pixels of latent and of condition. `vec` is the mean of the N code embeddings (taken
before the resize).

Three token layouts (FluxDiTConfig.patch and pack_condition), for a latent of h x w:

    patch 1                one token per latent pixel: [latent (in) | condition (cond)],
                           the condition resized to h x w (the reference's default)
    patch 2, packed        the above packed 2 x 2: 4*(in + cond) per token (diffusers' Flux
                           pipeline layout; our own checkpoints)
    patch 2, unpacked      the reference's use_patchify: [latent packed 2 x 2 (4*in) |
                           condition resized to the h/2 x w/2 token grid (cond)]

In every layout the output is the latent's share of a token (in, or 4*in packed) and the
packing is channel-major, (c, dy, dx) -> c*4 + dy*2 + dx, as both references pack it.

Sequence-parallel contract (Ulysses shards the token axis across ranks):

    forward(x, positions, timestep, vec, attention=None)
        x          (B, S_local, token_in_dim)   a shard of the tokens, e.g. 4*(in + cond)
        positions  (S_local, 3)   ids (0, row, col) of those tokens on the token grid
        timestep   (B,)           float, the value the sinusoid sees (sigma * 1000)
        vec        (B, vec_in_dim)
        attention  (q, k, v) -> out, all (B, H, S_local, head_dim); default full
                   scaled_dot_product_attention over the S_local tokens given
        returns    (B, S_local, token_out_dim)  e.g. 4*in_channels

Every operation but `attention` acts on each token alone: the embedders, LayerNorm,
modulation, the fused projections, QK RMS-norm, the MLP and the final layer. RoPE is
applied per token from its own row of `positions`, to q and k, after the QK-norm and before
`attention` is called. The modulation (shift/scale/gate of every block and of the final
layer) depends only on `timestep` and `vec`, never on tokens, so every rank computes the
same values. Hence splitting the tokens into shards (any split: contiguous or not, uneven
sizes) and passing an `attention` that attends each shard's q over every shard's k and v
(e.g. all-to-all to head shards, full attention, all-to-all back) gives, row for row, the
unsharded output. The tokens' order inside a sequence does not matter either: positions
travel with them. Padding a shard is exact too, provided `attention` masks the padded keys
(their positions may be anything) and the padded rows are dropped from the output.

`timestep`: diffusers' FluxTransformer2DModel takes sigma in [0, 1] and multiplies it by
1000 inside; this model takes the multiplied value, so that a sampler can truncate it to an
integer as the reference does while its Euler step keeps the exact sigma.

Checkpoints: our names, diffusers' FluxTransformer2DModel's or the reference's
VisionTransformer's, each config and naming read by models/flux_dit_formats.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.models.checkpoint_io import read_json
from gpu_workers.models.flux_dit_formats import (
    REFERENCE_CLASS,
    diffusers_config,
    read_weights,
    reference_config,
    state_dict_to_ours,
)
from gpu_workers.models.hf_weights import load_exact
from omni.shared.settings import json_key, read_json_config, to_json_config

# (q, k, v) -> out, all (B, H, S, head_dim); see the module docstring
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin (S_local, head_dim) float32

PATCH = 2  # Flux packs 2x2 latent pixels into one token
_NORM_EPS = 1e-6  # LayerNorm and QK RMSNorm, as diffusers' FluxSingleTransformerBlock
_TIME_FREQ_DIM = 256
_TIME_MAX_PERIOD = 10000.0


@dataclass(frozen=True, slots=True)
class FluxDiTConfig:
    """Defaults are the reference decoder's."""

    in_channels: int = 16  # latent channels (before packing)
    cond_channels: int = 1536  # codebook embedding width
    hidden_size: int = 1920
    num_heads: int = 24
    num_layers: int = 35  # single-stream blocks
    mlp_ratio: float = json_key(4.0, read=lambda key, v: float(v))
    axes_dims_rope: tuple[int, int, int] = json_key((8, 36, 36), read=lambda key, v: tuple(v))
    rope_theta: float = json_key(10000.0, read=lambda key, v: float(v))
    vec_in_dim: int = 1536  # the pooled (mean) condition's width
    # Latent pixels per token, each way: 1 (one token per latent pixel, as the reference's DiT
    # runs by default) or 2 (Flux's 2 x 2 packing, as diffusers' pipeline does).
    patch: int = 1
    # With patch 2, where the condition goes (see the module docstring's two layouts):
    # True packs it 2 x 2 like the latent (diffusers' Flux pipeline layout, ours); False
    # resizes it to the token grid and appends it unpacked (the reference's use_patchify).
    # The same thing at patch 1.
    pack_condition: bool = json_key(True, read=lambda key, v: _bool(key, v))

    def __post_init__(self) -> None:
        if self.patch not in (1, 2):
            raise ValueError(f"flux dit config: patch must be 1 or 2, got {self.patch!r}")
        if not isinstance(self.pack_condition, bool):
            raise ValueError(f"flux dit config: pack_condition must be a bool, got {self.pack_condition!r}")  # noqa: TRY004
        for name in ("in_channels", "cond_channels", "hidden_size", "num_heads", "num_layers", "vec_in_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"flux dit config: {name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"flux dit config: hidden_size {self.hidden_size} is not divisible by {self.num_heads} heads"
            )
        axes = self.axes_dims_rope
        if len(axes) != 3 or any(not isinstance(a, int) or a <= 0 or a % 2 for a in axes):
            raise ValueError(f"flux dit config: axes_dims_rope must be 3 positive even ints, got {axes!r}")
        if sum(axes) != self.head_dim:
            raise ValueError(
                f"flux dit config: axes_dims_rope {axes} sum to {sum(axes)}, not head_dim {self.head_dim}"
            )
        if not self.mlp_ratio > 0 or not self.rope_theta > 0:
            raise ValueError("flux dit config: mlp_ratio and rope_theta must be positive")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @property
    def condition_patch(self) -> int:
        """Condition pixels per token, each way: the latent's patch, or 1 when unpacked."""
        return self.patch if self.pack_condition else 1

    @property
    def token_in_dim(self) -> int:
        cp = self.condition_patch
        return self.patch * self.patch * self.in_channels + cp * cp * self.cond_channels

    @property
    def token_out_dim(self) -> int:
        return self.patch * self.patch * self.in_channels

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> FluxDiTConfig:
        """Our config.json, the reference's VisionTransformer one (`_class_name`
        "VisionTransformer", the published decoder/vision/transformer/), or diffusers'
        FluxTransformer2DModel one (another `_class_name`, or `num_single_layers`: in diffusers
        `num_layers` counts double blocks). A key left out takes its default: ours, the
        reference's or diffusers'."""
        if not isinstance(config, Mapping):
            raise ValueError(f"flux dit config must be a dict, got {type(config).__name__}")  # noqa: TRY004
        if config.get("_class_name") == REFERENCE_CLASS:
            return cls(**reference_config(config))
        if "_class_name" in config or "num_single_layers" in config:
            return cls(**diffusers_config(config))
        # other keys (model_type, what a tool adds) are left alone
        return read_json_config(cls, config, what="flux dit config", strict=False)

    @classmethod
    def from_dir(cls, path: str | Path) -> FluxDiTConfig:
        return cls.from_dict(read_json(Path(path) / "config.json"))

    def to_dict(self) -> dict[str, Any]:
        return to_json_config(self, model_type="flux_dit")


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"flux dit config: {key} must be true or false, got {value!r}")  # noqa: TRY004
    return value


# ---------------------------------------------------------------------------------------------
# Inputs: condition, packing, positions.


def condition_from_codes(
    codes: torch.Tensor, codebook: torch.Tensor, latent_hw: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """codes (B, G*G) ints, row-major on a G x G grid; codebook (num_codes, cond) ->
    cond_map (B, cond, h, w) bilinearly resized to the latent grid, vec (B, cond) the mean
    of the G*G code embeddings. Both in the codebook's dtype."""
    if codes.dim() != 2:
        raise ValueError(f"codes {tuple(codes.shape)}: want (B, G*G)")
    b, n = codes.shape
    g = math.isqrt(n)
    if g * g != n:
        raise ValueError(f"{n} codes do not form a square grid")
    if n and (int(codes.min()) < 0 or int(codes.max()) >= codebook.shape[0]):
        raise ValueError(f"codes outside [0, {codebook.shape[0]})")
    emb = F.embedding(codes, codebook)  # (B, N, cond)
    vec = emb.mean(dim=1)  # (B, cond)
    grid = emb.transpose(1, 2).reshape(b, codebook.shape[1], g, g)  # (B, cond, G, G)
    cond_map = F.interpolate(grid, size=latent_hw, mode="bilinear", align_corners=False)  # (B, cond, h, w)
    return cond_map, vec


def patchify(latents: torch.Tensor, patch: int = PATCH) -> torch.Tensor:
    """(B, C, h, w) -> (B, h/p * w/p, p*p*C): tokens row-major over the grid; inside a token
    the features run channel-major, (c, dy, dx) -> c*p*p + dy*p + dx, as diffusers' Flux
    pipeline packs them (_pack_latents) for p = 2. p = 1 is one token per latent pixel."""
    b, c, h, w = latents.shape
    if h % patch or w % patch:
        raise ValueError(f"latent {h}x{w} is not divisible by the {patch}x{patch} patch")
    x = latents.view(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpatchify(tokens: torch.Tensor, grid_h: int, grid_w: int, patch: int = PATCH) -> torch.Tensor:
    """(B, grid_h*grid_w, p*p*C) -> (B, C, p*grid_h, p*grid_w); the inverse of patchify."""
    b, n, d = tokens.shape
    if n != grid_h * grid_w or d % (patch * patch):
        raise ValueError(f"tokens {tuple(tokens.shape)} do not fill a {grid_h}x{grid_w} grid of {patch}x{patch} patches")
    c = d // (patch * patch)
    x = tokens.view(b, grid_h, grid_w, c, patch, patch)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, c, grid_h * patch, grid_w * patch)


def position_ids(grid_h: int, grid_w: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(grid_h*grid_w, 3) ids (0, row, col) of the tokens, row-major like patchify; the
    grid is the token grid (latent / 2), as diffusers' _prepare_latent_image_ids."""
    rows = torch.arange(grid_h, device=device).repeat_interleave(grid_w)
    cols = torch.arange(grid_w, device=device).repeat(grid_h)
    return torch.stack((torch.zeros_like(rows), rows, cols), dim=-1)


# ---------------------------------------------------------------------------------------------
# Embeddings: timestep sinusoid and 3-axis RoPE.


def timestep_embedding(timestep: torch.Tensor, dim: int = _TIME_FREQ_DIM) -> torch.Tensor:
    """(B,) -> (B, dim) float32, [cos | sin] of t * 10000^(-i / (dim/2)), i < dim/2
    (diffusers' get_timestep_embedding with flip_sin_to_cos=True, downscale_freq_shift=0)."""
    half = dim // 2
    exponent = -math.log(_TIME_MAX_PERIOD) * torch.arange(half, dtype=torch.float32, device=timestep.device)
    freqs = torch.exp(exponent / half)  # (dim/2,)
    args = timestep.float()[:, None] * freqs[None, :]  # (B, dim/2)
    return torch.cat((args.cos(), args.sin()), dim=-1)


def rope_cos_sin(
    positions: torch.Tensor, axes_dims: tuple[int, ...], theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (S, n_axes) -> cos, sin (S, head_dim) float32.

    head_dim is split into one band per axis (8 | 36 | 36 for the reference); in a band of
    width d, pair (2i, 2i+1) rotates by pos * theta^(-2i/d). Angles in float64 (as diffusers'
    FluxPosEmbed), so large positions keep their precision."""
    pos = positions.to(torch.float64)
    bands = []
    for axis, dim in enumerate(axes_dims):
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim)
        bands.append(pos[:, axis, None] * inv_freq)  # (S, dim/2)
    angles = torch.cat(bands, dim=-1).repeat_interleave(2, dim=-1)  # (S, head_dim), pairs share an angle
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x (B, S, H, D); cos, sin (S, D) float32; pair (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)
    xf = x.float()
    even, odd = xf.unflatten(-1, (-1, 2)).unbind(-1)  # (B, S, H, D/2) each
    rotated = torch.stack((-odd, even), dim=-1).flatten(-2)  # (B, S, H, D)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# Modules, small to large.


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim: int, hidden: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_dim, hidden)
        self.linear_2 = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))  # (B, hidden)


# A block's halves around its attention, as functions of the block (compiled_dit.py compiles
# them once for every block): (block, x, temb, rope) -> q, k, v, mlp, gate; (block, x,
# attention's output, mlp, gate) -> x.
HalfBefore = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
HalfAfter = Callable[..., torch.Tensor]


class SingleStreamBlock(nn.Module):
    """x + gate * linear_out([attention(rope(norm(q)), rope(norm(k)), v) | gelu(mlp)]), where
    q, k, v, mlp = linear_in(LayerNorm(x) * (1 + scale) + shift)."""

    def __init__(self, config: FluxDiTConfig) -> None:
        super().__init__()
        self.hidden = config.hidden_size
        self.num_heads = config.num_heads
        self.mlp_hidden = config.mlp_hidden
        self.modulation = nn.Linear(self.hidden, 3 * self.hidden)
        # one matmul for q, k, v and the MLP's input: rows [q | k | v | mlp]
        self.linear_in = nn.Linear(self.hidden, 3 * self.hidden + self.mlp_hidden)
        self.q_norm = nn.RMSNorm(config.head_dim, eps=_NORM_EPS)
        self.k_norm = nn.RMSNorm(config.head_dim, eps=_NORM_EPS)
        self.linear_out = nn.Linear(self.hidden + self.mlp_hidden, self.hidden)
        self.halves: tuple[HalfBefore, HalfAfter] = (SingleStreamBlock.before_attention, SingleStreamBlock.after_attention)

    def forward(
        self, x: torch.Tensor, temb: torch.Tensor, rope: Rope, attention: Attention
    ) -> torch.Tensor:
        """The block in two halves around the attention, which may be a collective (Ulysses):
        each half is what a compiled DiT compiles (gpu_workers/vision_decoder/compiled_dit.py
        sets `halves`; by default they run as written)."""
        before, after = self.halves
        q, k, v, mlp, gate = before(self, x, temb, rope)
        out = attention(q, k, v)  # (B, H, S, D)
        return after(self, x, out, mlp, gate)

    def before_attention(
        self, x: torch.Tensor, temb: torch.Tensor, rope: Rope
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, H, S, D) normed and rotated, the MLP's input and the gate."""
        shift, scale, gate = self.modulation(F.silu(temb)).chunk(3, dim=-1)  # (B, hidden) each
        h = F.layer_norm(x, (self.hidden,), eps=_NORM_EPS) * (1 + scale[:, None]) + shift[:, None]
        q, k, v, mlp = self._project_in(h)
        q, k, v = (t.unflatten(-1, (self.num_heads, -1)) for t in (q, k, v))  # (B, S, H, D) each
        q = apply_rope(self.q_norm(q), *rope)
        k = apply_rope(self.k_norm(k), *rope)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mlp, gate

    def after_attention(
        self, x: torch.Tensor, out: torch.Tensor, mlp: torch.Tensor, gate: torch.Tensor
    ) -> torch.Tensor:
        """x + gate * linear_out([attention | gelu(mlp)])."""
        b, s, _ = x.shape
        out = out.transpose(1, 2).reshape(b, s, self.hidden)
        y = self.linear_out(torch.cat((out, F.gelu(mlp, approximate="tanh")), dim=-1))  # (B, S, hidden)
        x = x + gate[:, None] * y
        if x.dtype == torch.float16:
            x = x.clip(-65504, 65504)  # as diffusers: an overflow must not become inf
        return x

    def _project_in(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v and the MLP's input. One matmul on accelerators; on a CPU four, over row
        slices of the same weight (no copy): each output is then contiguous, and at 4,096
        tokens the four run 10% faster than one (measured, bench/vision_decoder_bench.py)."""
        sizes = (self.hidden, self.hidden, self.hidden, self.mlp_hidden)
        if h.device.type != "cpu":
            return self.linear_in(h).split(sizes, dim=-1)
        weight, bias = self.linear_in.weight, self.linear_in.bias
        out, start = [], 0
        for size in sizes:
            out.append(F.linear(h, weight[start : start + size], bias[start : start + size]))
            start += size
        return tuple(out)


class FinalLayer(nn.Module):
    def __init__(self, config: FluxDiTConfig) -> None:
        super().__init__()
        self.hidden = config.hidden_size
        self.modulation = nn.Linear(self.hidden, 2 * self.hidden)
        self.linear = nn.Linear(self.hidden, config.token_out_dim)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        shift, scale = self.modulation(F.silu(temb)).chunk(2, dim=-1)  # (B, hidden) each
        x = F.layer_norm(x, (self.hidden,), eps=_NORM_EPS) * (1 + scale[:, None]) + shift[:, None]
        return self.linear(x)  # (B, S, 4*in_channels)


def run_blocks(
    blocks: Sequence[SingleStreamBlock], h: torch.Tensor, temb: torch.Tensor, rope: Rope, attention: Attention
) -> torch.Tensor:
    """h (B, S_local, hidden) through the blocks in order: FluxDiT's default BlockRunner."""
    for block in blocks:
        h = block(h, temb, rope, attention)
    return h


# (blocks, h, temb, rope, attention) -> h after them: what runs the blocks (a step cache may
# skip some; gpu_workers/vision_decoder/step_cache.py). It must hand every block the same
# temb, rope and attention, as run_blocks does.
BlockRunner = Callable[[Sequence[SingleStreamBlock], torch.Tensor, torch.Tensor, Rope, Attention], torch.Tensor]


class FluxDiT(nn.Module):
    def __init__(self, config: FluxDiTConfig) -> None:
        super().__init__()
        self.config = config
        self.time_embed = MLPEmbedder(_TIME_FREQ_DIM, config.hidden_size)
        self.vec_embed = MLPEmbedder(config.vec_in_dim, config.hidden_size)
        self.x_embed = nn.Linear(config.token_in_dim, config.hidden_size)
        self.blocks = nn.ModuleList(SingleStreamBlock(config) for _ in range(config.num_layers))
        self.final = FinalLayer(config)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        timestep: torch.Tensor,
        vec: torch.Tensor,
        attention: Attention | None = None,
        blocks: BlockRunner = run_blocks,
    ) -> torch.Tensor:
        """x (B, S_local, token_in_dim), positions (S_local, 3), timestep (B,) on the 0..1000
        scale, vec (B, vec_in_dim) -> (B, S_local, token_out_dim); see the module docstring.
        blocks runs the single-stream blocks (default: all of them, in order)."""
        c = self.config
        b, s, d = x.shape
        shapes_ok = positions.shape == (s, 3) and timestep.shape == (b,) and vec.shape == (b, c.vec_in_dim)
        if d != c.token_in_dim or not shapes_ok:
            raise ValueError(
                f"flux dit inputs: x {tuple(x.shape)}, positions {tuple(positions.shape)}, timestep "
                f"{tuple(timestep.shape)}, vec {tuple(vec.shape)}; want (B, S, {c.token_in_dim}), (S, 3), "
                f"(B,), (B, {c.vec_in_dim})"
            )
        dtype = self.x_embed.weight.dtype
        temb = self.time_embed(timestep_embedding(timestep).to(dtype)) + self.vec_embed(vec.to(dtype))  # (B, hidden)
        rope = rope_cos_sin(positions, c.axes_dims_rope, c.rope_theta)  # (S_local, head_dim) x 2
        attend = F.scaled_dot_product_attention if attention is None else attention
        h = self.x_embed(x.to(dtype))  # (B, S_local, hidden)
        h = blocks(list(self.blocks), h, temb, rope, attend)  # type: ignore[arg-type]  # ModuleList of blocks
        return self.final(h, temb)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load our names, the reference's or diffusers' (those two renamed first); all of
        them, each of the right shape."""
        load_exact(self, state_dict_to_ours(state_dict), "flux dit")

    @classmethod
    def from_dir(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> FluxDiT:
        """config.json (ours, the reference's or diffusers'), model.safetensors (sharded or
        not) or, in a folder saved by diffusers, diffusion_pytorch_model.safetensors (sharded
        or not); any of the three namings."""
        path = Path(path)
        config = FluxDiTConfig.from_dir(path)
        # built on meta: no memory or time spent on a random init the weights overwrite
        with torch.device("meta"):
            model = cls(config)
        model = model.to(dtype).to_empty(device=device)
        model.load_weights(read_weights(path, device))
        return model.eval()
