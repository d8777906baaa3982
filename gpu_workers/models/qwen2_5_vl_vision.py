"""Qwen2.5-VL vision transformer over a packed batch of images, plus an optional projector.

Input is what gpu_workers/preprocess/image.py (or transformers' Qwen2VLImageProcessor)
produces: every patch of every image flattened into one (N, C*T*P*P) matrix, patches of one
image in merge-block order (each run of merge**2 rows is one 2x2 block of neighbouring
patches), and grid_thw (num_images, 3) in patches. Images are packed into one variable-length
sequence; attention never crosses an image, and in the window blocks never crosses a window:

    window blocks   attend within a window of (window_size/patch)^2 patches of one frame
    full blocks     (fullatt_block_indexes) attend within one whole frame of one image

Inside the blocks the tokens sit in window order (each window contiguous), so both kinds of
segment are contiguous row ranges (a cu_seqlens list). The merger then folds each 2x2 block
into one token of out_hidden_size, and the rows are put back in image order.

Parameter names are those of transformers' Qwen2_5_VisionTransformerPretrainedModel, so
a real checkpoint loads with `load_hf_state_dict`. Two differences:
- patch_embed.proj is a Linear over flattened patches, one matmul for the whole batch. The
  checkpoint's Conv3d weight (hidden, C, T, P, P) has kernel == stride, so it is the same map;
  it is reshaped to (hidden, C*T*P*P) at load.
- `projector` (a Linear out_hidden_size -> projector_hidden_size, the omni model's bridge to
  the LLM width) exists only when the config asks for it; transformers has none.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.models.hf_weights import component_weights, load_exact

# RMSNorm eps is hard-coded to 1e-6 in the reference, not read from the config
_NORM_EPS = 1e-6
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}
# prefixes of the vision tower in full-model checkpoints: transformers 4.x, then 5.x
_HF_PREFIXES = ("visual.", "model.visual.")


@dataclass(frozen=True, slots=True)
class VisionEncoderConfig:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    fullatt_block_indexes: tuple[int, ...]
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112  # in pixels
    in_channels: int = 3
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    projector_hidden_size: int | None = None  # None: no projector, outputs are out_hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2

    @property
    def window_merged(self) -> int:
        """Window side in merged tokens (112 px / 14 / 2 = 4 for the reference)."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    @property
    def output_size(self) -> int:
        return self.projector_hidden_size or self.out_hidden_size

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> VisionEncoderConfig:
        """Read a Qwen2_5_VLVisionConfig dict, or a full model config holding `vision_config`."""
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a dict, got {type(config).__name__}")  # noqa: TRY004
        vision = config.get("vision_config", config)
        if not isinstance(vision, Mapping):
            raise ValueError("vision_config must be a dict")  # noqa: TRY004

        def require_int(key: str, default: int | None = None) -> int:
            value = vision.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"vision config: {key} must be a positive int, got {value!r}")
            return value

        hidden, heads = require_int("hidden_size"), require_int("num_heads")
        if hidden % heads or (hidden // heads) % 4:
            # the 2D rotary splits head_dim into h and w halves, each rotated in pairs
            raise ValueError(f"vision config: hidden_size/num_heads ({hidden}/{heads}) must be a multiple of 4")
        depth = require_int("depth")
        full = tuple(vision.get("fullatt_block_indexes") or ())
        if any(not isinstance(i, int) or not 0 <= i < depth for i in full):
            raise ValueError(f"vision config: fullatt_block_indexes {list(full)} must lie in [0, {depth})")
        act = vision.get("hidden_act", "silu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"vision config: hidden_act {act!r} is not supported ({', '.join(_ACTIVATIONS)})")
        rope = vision.get("rope_parameters") or {}
        projector = vision.get("projector_hidden_size", config.get("projector_hidden_size"))
        out = cls(
            depth=depth,
            hidden_size=hidden,
            num_heads=heads,
            intermediate_size=require_int("intermediate_size"),
            out_hidden_size=require_int("out_hidden_size"),
            fullatt_block_indexes=full,
            patch_size=require_int("patch_size", 14),
            temporal_patch_size=require_int("temporal_patch_size", 2),
            spatial_merge_size=require_int("spatial_merge_size", 2),
            window_size=require_int("window_size", 112),
            in_channels=require_int("in_channels", 3),
            hidden_act=act,
            rope_theta=float(rope.get("rope_theta") or vision.get("rope_theta") or 10000.0),
            projector_hidden_size=None if projector is None else int(projector),
        )
        if out.window_merged <= 0:
            raise ValueError(f"vision config: window_size {out.window_size} is smaller than one merged token")
        return out


# ---------------------------------------------------------------------------------------------
# Packing geometry: pure functions of grid_thw, computed once per forward on the CPU.


@dataclass(frozen=True, slots=True)
class PackedLayout:
    """Where every patch of a packed batch goes.

    order: (N,) patch rows in window order; x[order] puts each window's patches contiguously.
    window_seqlens, frame_seqlens: segment lengths in that order (window blocks, full blocks).
    positions: (N, 2) (h, w) patch coordinates in image order, for the 2D rotary.
    """

    order: torch.Tensor
    window_seqlens: list[int]
    frame_seqlens: list[int]
    positions: torch.Tensor


def packed_layout(grid_thw: list[list[int]], config: VisionEncoderConfig) -> PackedLayout:
    m, win = config.spatial_merge_size, config.window_merged
    orders, positions = [], []
    window_seqlens: list[int] = []
    frame_seqlens: list[int] = []
    num_units = 0  # merged tokens (2x2 blocks) before this image
    for t, h, w in grid_thw:
        if h % m or w % m:
            raise ValueError(f"grid {t}x{h}x{w} is not divisible by spatial_merge_size {m}")
        lh, lw = h // m, w // m  # merged grid of one frame
        # Each merged token's window id, frame-major then window row then window column.
        # A stable sort by it keeps row-major order inside a window, as the reference does.
        rows = torch.arange(lh).repeat_interleave(lw)  # (lh*lw,)
        cols = torch.arange(lw).repeat(lh)
        nwh, nww = -(-lh // win), -(-lw // win)
        window = (rows // win) * nww + cols // win  # (lh*lw,) window within the frame
        window = (torch.arange(t)[:, None] * (nwh * nww) + window).flatten()  # (t*lh*lw,)
        units = torch.argsort(window, stable=True) + num_units
        window_seqlens += [n * m * m for n in torch.bincount(window).tolist() if n]
        frame_seqlens += [h * w] * t
        # unit u covers patch rows [u*m*m, (u+1)*m*m)
        orders.append((units[:, None] * (m * m) + torch.arange(m * m)).flatten())
        # patch coordinates in merge-block order: (lh, lw, m, m) blocks of (h, w)
        hpos = (rows[:, None, None] * m + torch.arange(m)[None, :, None]).expand(-1, m, m)
        wpos = (cols[:, None, None] * m + torch.arange(m)[None, None, :]).expand(-1, m, m)
        positions.append(torch.stack((hpos.flatten(), wpos.flatten()), dim=-1).repeat(t, 1))
        num_units += t * lh * lw
    return PackedLayout(
        order=torch.cat(orders),
        window_seqlens=window_seqlens,
        frame_seqlens=frame_seqlens,
        positions=torch.cat(positions),
    )


class Segments:
    """Row indices of equal-length segments, grouped so that one SDPA call covers each length."""

    def __init__(self, seqlens: list[int], device: torch.device) -> None:
        starts: dict[int, list[int]] = {}
        offset = 0
        for n in seqlens:
            starts.setdefault(n, []).append(offset)
            offset += n
        # length -> (G*n,) rows of the G segments of that length, segment-major
        self.groups = [
            (n, (torch.tensor(s)[:, None] + torch.arange(n)).flatten().to(device)) for n, s in starts.items()
        ]
        self.total = offset


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Segments) -> torch.Tensor:
    """Non-causal attention restricted to each segment. q, k, v (N, H, D) -> (N, H, D)."""
    if len(segments.groups) == 1 and segments.groups[0][0] == q.shape[0]:  # one segment: no gather
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        return o.transpose(0, 1)
    out = torch.empty_like(q)
    heads, d = q.shape[1:]
    for n, rows in segments.groups:
        # (G*n, H, D) -> (G, H, n, D): G segments of length n as one batch
        qg, kg, vg = (x[rows].view(-1, n, heads, d).transpose(1, 2) for x in (q, k, v))
        out[rows] = F.scaled_dot_product_attention(qg, kg, vg).transpose(1, 2).reshape(-1, heads, d)
    return out


# ---------------------------------------------------------------------------------------------
# Modules, small to large.


class RMSNorm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (N, H); statistics in float32 like the reference
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + _NORM_EPS)
        return self.weight * xf.to(x.dtype)


class PatchEmbed(nn.Module):
    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        # The checkpoint's Conv3d(kernel == stride) as the equivalent Linear: one matmul
        # over all patches instead of a convolution over N tiny volumes.
        self.proj = nn.Linear(config.patch_dim, config.hidden_size, bias=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # (N, C*T*P*P) -> (N, hidden)
        return self.proj(pixel_values.to(self.proj.weight.dtype))


def rotary_cos_sin(
    positions: torch.Tensor, config: VisionEncoderConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (N, 2) of (h, w) -> cos, sin (N, head_dim) in float32.

    Angle layout per head: [h freqs | w freqs | h freqs | w freqs], each head_dim/4 wide,
    so that rotate_half pairs dimension i with i + head_dim/2 (the same axis and frequency).
    """
    quarter = config.head_dim // 4
    exponents = torch.arange(0, 2 * quarter, 2, dtype=torch.float32, device=positions.device) / (2 * quarter)
    inv_freq = 1.0 / (config.rope_theta**exponents)  # (D/4,)
    freqs = positions.float()[:, :, None] * inv_freq  # (N, 2, D/4)
    angles = freqs.flatten(1)  # (N, D/2): h then w
    angles = torch.cat((angles, angles), dim=-1)  # (N, D)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x (N, H, D); cos, sin (N, D) float32; rotated in float32 like the reference
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=True)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, -1).unbind(1)  # (N, H, D) each
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = segment_attention(q, k, v, segments)  # (N, H, D)
        return self.proj(out.reshape(n, -1))  # (N, hidden)


class MLP(nn.Module):
    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        self.act = _ACTIVATIONS[config.hidden_act]
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))  # (N, hidden)


class VisionBlock(nn.Module):
    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(config.hidden_size)
        self.attn = Attention(config)
        self.norm2 = RMSNorm(config.hidden_size)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        self.merged_size = config.hidden_size * config.merge_unit
        self.ln_q = RMSNorm(config.hidden_size)
        # Sequential so the names are mlp.0 / mlp.2 as in the checkpoint
        self.mlp = nn.Sequential(
            nn.Linear(self.merged_size, self.merged_size),
            nn.GELU(),
            nn.Linear(self.merged_size, config.out_hidden_size),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (N, hidden) -> (N/merge_unit, hidden*merge_unit) -> (N/merge_unit, out_hidden)
        return self.mlp(self.ln_q(x).view(-1, self.merged_size))


class Qwen2_5_VisionEncoder(nn.Module):
    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config)
        self.projector = (
            nn.Linear(config.out_hidden_size, config.projector_hidden_size)
            if config.projector_hidden_size is not None
            else None
        )

    @staticmethod
    def num_output_tokens(grid_thw: torch.Tensor | list[list[int]], spatial_merge_size: int) -> list[int]:
        """Output rows per image: t*h*w / merge**2 (to split forward()'s result per image)."""
        rows = grid_thw.tolist() if isinstance(grid_thw, torch.Tensor) else grid_thw
        return [t * h * w // spatial_merge_size**2 for t, h, w in rows]

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """pixel_values (N, C*T*P*P), grid_thw (num_images, 3) -> (N/merge_unit, output_size),
        the images' merged tokens concatenated in input order."""
        c = self.config
        grid = [[int(v) for v in row] for row in grid_thw.tolist()]
        n = sum(t * h * w for t, h, w in grid)
        if pixel_values.shape != (n, c.patch_dim):
            raise ValueError(
                f"pixel_values {tuple(pixel_values.shape)} do not match grid_thw: want ({n}, {c.patch_dim})"
            )
        device = pixel_values.device
        layout = packed_layout(grid, c)
        order = layout.order.to(device)

        x = self.patch_embed(pixel_values)[order]  # (N, hidden), window order
        cos, sin = rotary_cos_sin(layout.positions.to(device)[order], c)  # (N, head_dim) each
        windows = Segments(layout.window_seqlens, device)
        frames = Segments(layout.frame_seqlens, device)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, frames if i in c.fullatt_block_indexes else windows)

        merged = self.merger(x)  # (N/mu, out_hidden), window order
        # order moves whole merge units, so unit order is order[::mu] / mu; invert it
        unit_order = order[:: c.merge_unit] // c.merge_unit
        out = torch.empty_like(merged)
        out[unit_order] = merged
        return out if self.projector is None else self.projector(out)

    def load_hf_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load transformers-named weights (bare, "visual." or "model.visual." prefixed; other
        towers' keys in a full checkpoint are skipped). Missing or unexpected keys raise."""
        weights = component_weights(state_dict, _HF_PREFIXES, _VISION_KEY)
        load_exact(self, weights, "vision encoder", _linear_patch_embed)


def _linear_patch_embed(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if name == "patch_embed.proj.weight" and tensor.dim() == 5:
        return tensor.reshape(tensor.shape[0], -1)  # Conv3d (hidden, C, T, P, P) -> Linear
    return tensor


_VISION_KEY = re.compile(r"^(patch_embed|blocks|merger|projector)\.")
