"""The decoder half of the Flux VAE: 16-channel latents in, an RGB image in [-1, 1] out (8x).

What the image decoder does after its last Euler step, in the reference's order:

    latents (B, 16, h, w)      the DiT's raw output latents, unscaled
      / scaling_factor + shift_factor     (0.3611, 0.1159 for Flux; FluxPipeline does the same)
      -> post_quant_conv        (absent in Flux: use_post_quant_conv=False)
      -> decoder                conv_in, mid block (resnet, attention, resnet), up blocks, conv_out
    image (B, 3, 8h, 8w)       nominally [-1, 1], not clamped here
      -> to_uint8 / to_png      clamp, (x + 1) / 2 * 255, truncated (the reference's astype)

Parameter names are diffusers' AutoencoderKL names ("decoder.mid_block.attentions.0.to_q.weight"),
so the vae/ folder of a Flux checkpoint (or the reference's) loads as it is; its encoder.* and
quant_conv.* weights are never read. Only the configuration Flux uses is built: SiLU, GroupNorm
(eps 1e-6), UpDecoderBlock2D, a single-head mid-block attention; anything else raises.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors import safe_open
from torch import nn

from gpu_workers.models.checkpoint_io import read_json
from gpu_workers.models.hf_weights import load_exact

# diffusers' AutoencoderKL __init__ defaults: what a config.json that leaves a key out means
# (diffusers writes every key, so this matters only for hand-written configs)
_DIFFUSERS_DEFAULTS: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 4,
    "block_out_channels": [64],
    "layers_per_block": 1,
    "norm_num_groups": 32,
    "act_fn": "silu",
    "scaling_factor": 0.18215,
    "shift_factor": None,
    "use_post_quant_conv": True,
    "mid_block_add_attention": True,
}
WEIGHT_FILES = ("diffusion_pytorch_model.safetensors", "model.safetensors")
IMAGE_FORMATS = ("png", "jpeg", "webp")
_EPS = 1e-6  # every GroupNorm of the decoder


@dataclass(frozen=True, slots=True)
class FluxVAEConfig:
    # defaults are the Flux VAE's (black-forest-labs/FLUX.1-dev vae/config.json)
    latent_channels: int = 16
    out_channels: int = 3
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    norm_num_groups: int = 32
    mid_block_add_attention: bool = True
    use_post_quant_conv: bool = False
    scaling_factor: float = 0.3611
    shift_factor: float = 0.1159

    @property
    def upscale(self) -> int:
        # one 2x upsampler per up block but the last: 8 for four blocks
        return 2 ** (len(self.block_out_channels) - 1)

    @classmethod
    def from_diffusers(cls, config: Mapping[str, Any]) -> FluxVAEConfig:
        """Read a diffusers AutoencoderKL config.json dict."""
        if not isinstance(config, Mapping):
            raise ValueError(f"vae config must be a dict, got {type(config).__name__}")  # noqa: TRY004
        cfg = {**_DIFFUSERS_DEFAULTS, **config}
        name = cfg.get("_class_name", "AutoencoderKL")
        if name != "AutoencoderKL":
            raise ValueError(f"vae config: _class_name {name!r} is not AutoencoderKL")

        def positive_int(key: str) -> int:
            value = cfg[key]
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"vae config: {key} must be a positive int, got {value!r}")
            return value

        def number(key: str, none_means: float) -> float:
            value = cfg[key]
            if value is None:
                return none_means
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"vae config: {key} must be a number, got {value!r}")
            return float(value)

        blocks = cfg["block_out_channels"]
        if (
            not isinstance(blocks, list | tuple)
            or not blocks
            or any(not isinstance(c, int) or isinstance(c, bool) or c <= 0 for c in blocks)
        ):
            raise ValueError(f"vae config: block_out_channels must be a list of positive ints, got {blocks!r}")
        groups = positive_int("norm_num_groups")
        if any(c % groups for c in blocks):
            raise ValueError(f"vae config: block_out_channels {list(blocks)} are not all divisible by {groups} groups")
        if cfg["act_fn"] != "silu":
            raise ValueError(f"vae config: act_fn {cfg['act_fn']!r} is not supported (silu)")
        up_types = cfg.get("up_block_types", ["UpDecoderBlock2D"] * len(blocks))
        if list(up_types) != ["UpDecoderBlock2D"] * len(blocks):
            raise ValueError(f"vae config: up_block_types {up_types!r}: want UpDecoderBlock2D x {len(blocks)}")
        scaling = number("scaling_factor", 1.0)
        if scaling == 0:
            raise ValueError("vae config: scaling_factor must not be 0")
        return cls(
            latent_channels=positive_int("latent_channels"),
            out_channels=positive_int("out_channels"),
            block_out_channels=tuple(blocks),
            layers_per_block=positive_int("layers_per_block"),
            norm_num_groups=groups,
            mid_block_add_attention=bool(cfg["mid_block_add_attention"]),
            use_post_quant_conv=bool(cfg["use_post_quant_conv"]),
            scaling_factor=scaling,
            # diffusers' None: the Flux pipeline would fail on it; no shift is what it means
            shift_factor=number("shift_factor", 0.0),
        )


# ---------------------------------------------------------------------------------------------
# Modules, small to large.


def _group_norm(config: FluxVAEConfig, channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(config.norm_num_groups, channels, eps=_EPS)


class ResnetBlock(nn.Module):
    def __init__(self, config: FluxVAEConfig, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.norm1 = _group_norm(config, in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = _group_norm(config, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        # a 1x1 projection only where the block changes width
        self.conv_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return x + h  # (B, C_out, H, W)


class MidAttention(nn.Module):
    """One head as wide as the channels, over every latent pixel, with a residual."""

    def __init__(self, config: FluxVAEConfig, channels: int) -> None:
        super().__init__()
        self.group_norm = _group_norm(config, channels)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        # a list so the name is diffusers' "to_out.0" (its to_out.1 is a parameterless dropout)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        t = self.group_norm(x).flatten(2).transpose(1, 2)  # (B, H*W, C), pixels row-major
        q, k, v = (p(t).unsqueeze(1) for p in (self.to_q, self.to_k, self.to_v))  # (B, 1, H*W, C)
        out = F.scaled_dot_product_attention(q, k, v).squeeze(1)  # scale 1/sqrt(C)
        out = self.to_out[0](out)  # (B, H*W, C)
        return x + out.transpose(1, 2).reshape(b, c, h, w)


class MidBlock(nn.Module):
    def __init__(self, config: FluxVAEConfig) -> None:
        super().__init__()
        c = config.block_out_channels[-1]
        self.resnets = nn.ModuleList([ResnetBlock(config, c, c), ResnetBlock(config, c, c)])
        self.attentions = nn.ModuleList([MidAttention(config, c)] if config.mid_block_add_attention else [])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.resnets[0](x)
        for attention in self.attentions:
            x = attention(x)
        return self.resnets[1](x)


class Upsampler(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # nearest 2x: each latent pixel becomes a 2x2 block, then a 3x3 conv smooths it
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))  # (B, C, 2H, 2W)


class UpBlock(nn.Module):
    def __init__(self, config: FluxVAEConfig, in_channels: int, out_channels: int, upsample: bool) -> None:
        super().__init__()
        # layers_per_block + 1 resnets on the way up (one more than the encoder has on the way down)
        widths = [in_channels] + [out_channels] * (config.layers_per_block + 1)
        self.resnets = nn.ModuleList(ResnetBlock(config, i, o) for i, o in pairwise(widths))
        self.upsamplers = nn.ModuleList([Upsampler(out_channels)] if upsample else [])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x)
        for upsampler in self.upsamplers:
            x = upsampler(x)
        return x


class Decoder(nn.Module):
    def __init__(self, config: FluxVAEConfig) -> None:
        super().__init__()
        widths = list(reversed(config.block_out_channels))  # (512, 512, 256, 128) for Flux
        self.conv_in = nn.Conv2d(config.latent_channels, widths[0], 3, padding=1)
        self.mid_block = MidBlock(config)
        self.up_blocks = nn.ModuleList(
            UpBlock(config, widths[max(i - 1, 0)], widths[i], upsample=i < len(widths) - 1) for i in range(len(widths))
        )
        self.conv_norm_out = _group_norm(config, widths[-1])
        self.conv_out = nn.Conv2d(widths[-1], config.out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.mid_block(self.conv_in(z))  # (B, 512, h, w)
        for block in self.up_blocks:
            x = block(x)  # the first len-1 blocks double H and W
        return self.conv_out(F.silu(self.conv_norm_out(x)))  # (B, 3, 8h, 8w)


class FluxVAEDecoder(nn.Module):
    def __init__(self, config: FluxVAEConfig) -> None:
        super().__init__()
        self.config = config
        c = config.latent_channels
        self.post_quant_conv = nn.Conv2d(c, c, 1) if config.use_post_quant_conv else None
        self.decoder = Decoder(config)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.decode(latents)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """The DiT's raw latents (B, C, h, w) -> image (B, 3, 8h, 8w), nominally [-1, 1], unclamped.

        The un-scaling latents / scaling_factor + shift_factor happens here, first, exactly as
        the Flux pipeline and the reference do it before calling AutoencoderKL.decode; callers
        never scale. It runs in float32 whatever the latents' dtype, then the result is cast to
        the decoder's dtype.
        """
        c = self.config
        if latents.dim() != 4 or latents.shape[1] != c.latent_channels:
            raise ValueError(f"latents {tuple(latents.shape)}: want (B, {c.latent_channels}, h, w)")
        weight = self.decoder.conv_in.weight
        z = (latents.float() / c.scaling_factor + c.shift_factor).to(device=weight.device, dtype=weight.dtype)
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        return self.decoder(z)

    def load_diffusers_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load an AutoencoderKL state dict (bare or "vae."-prefixed names); encoder.* and
        quant_conv.* are skipped, anything else missing or unexpected raises."""
        load_exact(self, _decoder_weights(state_dict), "flux vae decoder")

    @classmethod
    def from_dir(
        cls, component_dir: Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> FluxVAEDecoder:
        """A diffusers vae/ folder: config.json and diffusion_pytorch_model.safetensors (or
        model.safetensors). Only the decoder's tensors are read from the file."""
        raw = read_json(component_dir / "config.json")
        weights_path = next((component_dir / n for n in WEIGHT_FILES if (component_dir / n).is_file()), None)
        if weights_path is None:
            raise ValueError(f"{component_dir}: neither {' nor '.join(WEIGHT_FILES)} found")
        with torch.device("meta"):
            model = cls(FluxVAEConfig.from_diffusers(raw))
        model = model.to(dtype).to_empty(device=device)
        with safe_open(str(weights_path), framework="pt", device=str(device)) as f:
            names = [n for n in f.keys() if _is_decoder_weight(n)]  # noqa: SIM118 - safe_open is not a dict
            model.load_diffusers_state_dict({n: f.get_tensor(n).to(dtype) for n in names})
        return model.eval()


_PREFIX = "vae."  # a whole-pipeline state dict


def _is_decoder_weight(name: str) -> bool:
    return name.removeprefix(_PREFIX).startswith(("decoder.", "post_quant_conv."))


def _decoder_weights(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    ours: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        bare = name.removeprefix(_PREFIX)
        if bare.startswith(("encoder.", "quant_conv.")):
            continue  # the encoder half: image -> latents, never run by a decoder
        ours[bare] = tensor
    return ours


# ---------------------------------------------------------------------------------------------
# Image (3, H, W) in [-1, 1] -> bytes.


def to_uint8(image: torch.Tensor) -> np.ndarray:
    """(3, H, W) float -> (H, W, 3) uint8, as the reference's pipeline postprocesses:
    clamp(-1, 1), (x + 1) / 2, * 255, then numpy's astype(uint8), which TRUNCATES (level
    k + 0.7 gives k; diffusers' VaeImageProcessor would round it to k + 1). Computed in float32
    whatever the input's dtype (the reference clamps and halves in its bf16, so a bf16 image
    can differ from it by one level); NaN becomes 0 (mid grey, 127) rather than an undefined
    byte."""
    if image.dim() != 3 or image.shape[0] != 3:
        raise ValueError(f"image {tuple(image.shape)}: want (3, H, W)")
    x = torch.nan_to_num(image.detach().float().cpu(), nan=0.0).clamp(-1.0, 1.0)
    x = (x + 1) / 2 * 255  # in [0, 255]: the cast truncates toward zero, i.e. floors
    return x.to(torch.uint8).permute(1, 2, 0).contiguous().numpy()


def to_png(image: torch.Tensor) -> bytes:
    return to_image_bytes(image, "png")


def to_image_bytes(image: torch.Tensor, fmt: str, quality: int = 95) -> bytes:
    """Encode (3, H, W) in [-1, 1] as png (lossless, quality unused), jpeg or webp (quality
    1..100). The same image always gives the same bytes."""
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"image format {fmt!r} is not supported ({', '.join(IMAGE_FORMATS)})")
    if not 1 <= quality <= 100:
        raise ValueError(f"quality {quality} is outside 1..100")
    pil = Image.fromarray(to_uint8(image))
    out = io.BytesIO()
    if fmt == "png":
        pil.save(out, format="PNG")
    elif fmt == "jpeg":
        pil.save(out, format="JPEG", quality=quality)
    else:
        pil.save(out, format="WEBP", quality=quality)
    return out.getvalue()
