"""SigLIP vision tower, cut at an intermediate layer (the TA-Tok image tokenizer's encoder).

The reference reads `hidden_states[feature_layer]` of transformers' SiglipVisionModel, where
hidden_states has num_hidden_layers + 1 entries:

    hidden_states[0]      patch + position embeddings
    hidden_states[k]      output of encoder layer k-1 (k = 1 .. L)
    hidden_states[-2]     output of layer L-2, the second-to-last (TA-Tok's choice)

so only the first `num_layers` = (feature_layer mod L+1) encoder layers are built and run;
post_layernorm and the attention-pooling head never touch that output and are not built.
Parameter names are transformers' SiglipVisionModel names (5.x: bare; 4.x: "vision_model."
prefixed) so a real checkpoint loads with `load_hf_state_dict`.
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

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}
# the tower in full checkpoints: SiglipVisionModel / SiglipModel (4.x), SiglipModel inside a VLM
_HF_PREFIXES = ("vision_model.", "model.vision_model.")
_VISION_KEY = re.compile(r"^(embeddings|encoder|post_layernorm|head)\.")
_LAYER_KEY = re.compile(r"^encoder\.layers\.(\d+)\.")


@dataclass(frozen=True, slots=True)
class SiglipVisionConfig:
    # defaults are transformers' SiglipVisionConfig defaults: config.json files saved by
    # transformers leave out every value equal to them
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 16
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"

    @property
    def grid_size(self) -> int:
        # 384 // 14 = 27: the valid-padding conv drops the last 384 - 378 = 6 pixel rows and columns
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size**2

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> SiglipVisionConfig:
        """Read a SiglipVisionConfig dict, or a full model config holding `vision_config`."""
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a dict, got {type(config).__name__}")  # noqa: TRY004
        vision = config.get("vision_config", config)
        if not isinstance(vision, Mapping):
            raise ValueError("vision_config must be a dict")  # noqa: TRY004

        def require_int(key: str, default: int) -> int:
            value = vision.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"siglip vision config: {key} must be a positive int, got {value!r}")
            return value

        d = cls()
        hidden = require_int("hidden_size", d.hidden_size)
        heads = require_int("num_attention_heads", d.num_attention_heads)
        if hidden % heads:
            raise ValueError(f"siglip vision config: hidden_size {hidden} is not divisible by {heads} heads")
        image, patch = require_int("image_size", d.image_size), require_int("patch_size", d.patch_size)
        if image < patch:
            raise ValueError(f"siglip vision config: image_size {image} is smaller than patch_size {patch}")
        act = vision.get("hidden_act", d.hidden_act)
        if act not in _ACTIVATIONS:
            raise ValueError(f"siglip vision config: hidden_act {act!r} is not supported ({', '.join(_ACTIVATIONS)})")
        return cls(
            hidden_size=hidden,
            intermediate_size=require_int("intermediate_size", d.intermediate_size),
            num_hidden_layers=require_int("num_hidden_layers", d.num_hidden_layers),
            num_attention_heads=heads,
            num_channels=require_int("num_channels", d.num_channels),
            image_size=image,
            patch_size=patch,
            layer_norm_eps=float(vision.get("layer_norm_eps", d.layer_norm_eps)),
            hidden_act=act,
        )


def num_layers_for(config: SiglipVisionConfig, feature_layer: int) -> int:
    """Encoder layers to run so the output is hidden_states[feature_layer] (Python indexing
    into the L+1 entries, so -1 is the last layer's output before post_layernorm)."""
    total = config.num_hidden_layers + 1
    if not -total <= feature_layer < total:
        raise ValueError(f"feature_layer {feature_layer} is outside [{-total}, {total}) for {total - 1} layers")
    return feature_layer % total


# ---------------------------------------------------------------------------------------------
# Modules, small to large.


class SiglipEmbeddings(nn.Module):
    def __init__(self, config: SiglipVisionConfig) -> None:
        super().__init__()
        self.image_size = config.image_size
        # kernel == stride: each output pixel is one patch through one (hidden, C*P*P) matmul
        self.patch_embedding = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
        )
        self.position_embedding = nn.Embedding(config.num_patches, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # (B, C, S, S) -> (B, hidden, G, G) -> (B, G*G, hidden), patches row-major
        x = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))
        return x.flatten(2).transpose(1, 2) + self.position_embedding.weight


class SiglipAttention(nn.Module):
    def __init__(self, config: SiglipVisionConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        h = config.hidden_size
        self.q_proj = nn.Linear(h, h)
        self.k_proj = nn.Linear(h, h)
        self.v_proj = nn.Linear(h, h)
        self.out_proj = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        # (B, N, hidden) -> (B, H, N, D); full bidirectional attention within each image
        q, k, v = (p(x).view(b, n, self.num_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v)  # (B, H, N, D), scale 1/sqrt(D)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, -1))  # (B, N, hidden)


class SiglipMLP(nn.Module):
    def __init__(self, config: SiglipVisionConfig) -> None:
        super().__init__()
        self.act = _ACTIVATIONS[config.hidden_act]
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))  # (B, N, hidden)


class SiglipEncoderLayer(nn.Module):
    def __init__(self, config: SiglipVisionConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = SiglipAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = SiglipMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEncoder(nn.Module):
    def __init__(self, config: SiglipVisionConfig, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(config) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class SiglipVisionTower(nn.Module):
    def __init__(self, config: SiglipVisionConfig, feature_layer: int = -2) -> None:
        super().__init__()
        self.config = config
        self.num_layers = num_layers_for(config, feature_layer)
        self.embeddings = SiglipEmbeddings(config)
        self.encoder = SiglipEncoder(config, self.num_layers)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values (B, C, S, S), normalised -> (B, G*G, hidden), patches row-major."""
        c = self.config
        want = (c.num_channels, c.image_size, c.image_size)
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != want:
            # no position-embedding interpolation: the tokenizer always resizes to image_size
            raise ValueError(f"pixel_values {tuple(pixel_values.shape)}: want (B, {', '.join(map(str, want))})")
        return self.encoder(self.embeddings(pixel_values))

    def load_hf_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load transformers-named weights (bare, "vision_model." or "model.vision_model."
        prefixed; a full SigLIP checkpoint's text tower is skipped). Layers past the feature
        layer, post_layernorm and head.* are dropped; anything else missing or unexpected raises."""
        weights = component_weights(state_dict, _HF_PREFIXES, _VISION_KEY)
        load_exact(self, {k: v for k, v in weights.items() if not self._unused(k)}, "siglip vision tower")

    def _unused(self, name: str) -> bool:
        # position_ids is a non-persistent buffer in transformers, saved by some old checkpoints
        if name.startswith(("post_layernorm.", "head.")) or name == "embeddings.position_ids":
            return True
        layer = _LAYER_KEY.match(name)
        # layers [num_layers, num_hidden_layers) exist in the checkpoint but feed only later
        # hidden states; an index past the config's depth is a wrong checkpoint and stays to raise
        return layer is not None and self.num_layers <= int(layer[1]) < self.config.num_hidden_layers
