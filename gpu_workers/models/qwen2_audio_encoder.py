"""Qwen2-Audio encoder (a Whisper encoder with an average pool) plus an optional projector.

Input is what gpu_workers/preprocess/audio.py (or WhisperFeatureExtractor) produces: 30 s
windows of log-mel features (B, n_mels, 3000) and each window's valid frame count. Per window:

    features (n_mels, 3000)
      -> conv1 (k3, s1, p1) + GELU -> conv2 (k3, s2, p1) + GELU     (1500, d_model)
      -> + embed_positions -> pre-LN transformer layers              (1500, d_model)
      -> avg pool (k2, s2) -> layer_norm                             (750, d_model)
      -> projector (optional): Linear d -> d, GELU, Linear d -> llm  (750, llm width)

Lengths, for V valid frames (transformers' _get_feat_extract_output_lengths):

    after conv2     L = (V - 1) // 2 + 1       conv rows [0, L) are audio, the rest padding
    after the pool  N = (L - 2) // 2 + 1 = L // 2   (rows 2i, 2i+1 -> token i, i < N)

Like transformers' Qwen2AudioModel, attention keys at conv rows >= L are masked out, and the
padding rows still pass through the convs (the conv at row L-1 reads padded frames V, V+1, the
extractor's log-mel of silence, exactly as the reference does). Output rows >= N are dropped;
the valid rows of every window are packed into one (sum N, out) matrix.

One deviation, exact up to float rounding: the batch is cut to the longest window's L before
the transformer. Rows past every window's L are masked keys whose queries are thrown away,
so they change nothing; a 3 s clip costs 150 rows of attention instead of 1500.

Parameter names are those of transformers' Qwen2AudioEncoder (bare, "audio_tower." or
"model.audio_tower." prefixed), so a real checkpoint loads with `load_hf_state_dict`.
`projector` is the omni model's audio bridge to the LLM (1280 -> 1280 -> 4096 in the reference
model, see REFERENCE_MODEL.md); it exists only when the config sets `projector_hidden_size`,
and its weights are named projector.0.{weight,bias} and projector.2.{weight,bias} (an
nn.Sequential of Linear, GELU, Linear). Qwen2-Audio's own multi_modal_projector (one Linear)
is not part of this tower.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.models.hf_weights import component_weights, load_exact

# the FFN activation (config.activation_function); the two conv GELUs are always exact GELU
_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}
# prefixes of the audio tower in full-model checkpoints: transformers 4.x, then 5.x
_HF_PREFIXES = ("audio_tower.", "model.audio_tower.")
_CONV_STRIDES = (1, 2)  # conv1, conv2: one output row per two mel frames


@dataclass(frozen=True, slots=True)
class AudioEncoderConfig:
    num_mel_bins: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    d_model: int
    max_source_positions: int = 1500  # conv2 rows per window: 3000 mel frames / 2
    activation_function: str = "gelu"
    projector_hidden_size: int | None = None  # None: no projector, outputs are d_model wide

    @property
    def num_frames(self) -> int:
        """Mel frames per window that the encoder accepts (3000 = 30 s)."""
        return self.max_source_positions * _CONV_STRIDES[0] * _CONV_STRIDES[1]

    @property
    def output_size(self) -> int:
        return self.projector_hidden_size or self.d_model

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> AudioEncoderConfig:
        """Read a Qwen2AudioEncoderConfig dict, or a full model config holding `audio_config`.

        scale_embedding is not read: transformers' Qwen2AudioEncoder computes embed_scale
        but never applies it."""
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a dict, got {type(config).__name__}")  # noqa: TRY004
        audio = config.get("audio_config", config)
        if not isinstance(audio, Mapping):
            raise ValueError("audio_config must be a dict")  # noqa: TRY004

        def require_int(key: str, default: int | None = None) -> int:
            value = audio.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"audio config: {key} must be a positive int, got {value!r}")
            return value

        d_model, heads = require_int("d_model"), require_int("encoder_attention_heads")
        if d_model % heads:
            raise ValueError(f"audio config: d_model {d_model} is not divisible by {heads} heads")
        act = audio.get("activation_function", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"audio config: activation_function {act!r} is not supported ({', '.join(_ACTIVATIONS)})")
        projector = audio.get("projector_hidden_size", config.get("projector_hidden_size"))
        if projector is not None and (not isinstance(projector, int) or isinstance(projector, bool) or projector <= 0):
            raise ValueError(f"audio config: projector_hidden_size must be a positive int, got {projector!r}")
        return cls(
            num_mel_bins=require_int("num_mel_bins", 128),
            encoder_layers=require_int("encoder_layers"),
            encoder_attention_heads=heads,
            encoder_ffn_dim=require_int("encoder_ffn_dim"),
            d_model=d_model,
            max_source_positions=require_int("max_source_positions", 1500),
            activation_function=act,
            projector_hidden_size=projector,
        )


def output_lengths(valid_frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid mel frames (B,) -> (valid conv2 rows, output tokens), each (B,)."""
    conv_rows = (valid_frames - 1) // 2 + 1
    return conv_rows, (conv_rows - 2) // 2 + 1


# ---------------------------------------------------------------------------------------------
# Modules, small to large.


class Attention(nn.Module):
    def __init__(self, config: AudioEncoderConfig) -> None:
        super().__init__()
        self.num_heads = config.encoder_attention_heads
        d = config.d_model
        # Whisper: no bias on k (a key bias would shift every score of a query equally)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=True)
        self.q_proj = nn.Linear(d, d, bias=True)
        self.out_proj = nn.Linear(d, d, bias=True)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        # x (B, T, d); key_mask (B, 1, 1, T) bool, True = attend; None = all rows valid
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.num_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)  # (B, H, T, D)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, -1))  # (B, T, d)


class EncoderLayer(nn.Module):
    def __init__(self, config: AudioEncoderConfig) -> None:
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.self_attn = Attention(config)
        self.final_layer_norm = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, config.d_model)
        self.act = _ACTIVATIONS[config.activation_function]

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), key_mask)
        x = x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))
        if x.dtype == torch.float16:  # as the reference: keep fp16 residuals finite
            limit = torch.finfo(x.dtype).max - 1000
            x = x.clamp(-limit, limit)
        return x  # (B, T, d)


class Qwen2AudioEncoder(nn.Module):
    def __init__(self, config: AudioEncoderConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.conv1 = nn.Conv1d(config.num_mel_bins, d, kernel_size=3, stride=_CONV_STRIDES[0], padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=_CONV_STRIDES[1], padding=1)
        # an Embedding for the checkpoint's name; Whisper stores fixed sinusoids in it
        self.embed_positions = nn.Embedding(config.max_source_positions, d)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.layer_norm = nn.LayerNorm(d)
        self.projector = (
            nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, config.projector_hidden_size))
            if config.projector_hidden_size is not None
            else None
        )

    def forward(self, features: torch.Tensor, valid_frames: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """features (B, n_mels, num_frames), valid_frames (B,) in [1, num_frames] ->
        (sum N, output_size) every window's valid tokens in batch order, and each N."""
        c = self.config
        if features.dim() != 3 or features.shape[1:] != (c.num_mel_bins, c.num_frames):
            raise ValueError(f"audio features {tuple(features.shape)}: want (B, {c.num_mel_bins}, {c.num_frames})")
        valid = valid_frames.to(device=features.device, dtype=torch.long)
        if valid.shape != features.shape[:1]:
            raise ValueError(f"valid_frames {tuple(valid_frames.shape)} does not match {features.shape[0]} windows")
        if bool(((valid < 1) | (valid > c.num_frames)).any()):
            raise ValueError(f"valid_frames must lie in [1, {c.num_frames}], got {valid.tolist()}")
        conv_rows, num_tokens = output_lengths(valid)
        rows = int(conv_rows.max())
        # conv2 row j reads conv1 rows 2j-1..2j+1, which read frames 2j-2..2j+2: rows [0, rows)
        # need frames [0, 2*rows + 1) and nothing past them (the rest is masked anyway)
        frames = features[..., : min(c.num_frames, 2 * rows + 1)].to(self.conv1.weight.dtype)

        x = F.gelu(self.conv1(frames))  # (B, d, F)
        x = F.gelu(self.conv2(x))[..., :rows].transpose(1, 2)  # (B, rows, d)
        x = x + self.embed_positions.weight[:rows]
        # (B, 1, 1, rows) True = a real key; None when every window fills all rows (no padding)
        key_mask = None
        if bool((conv_rows < rows).any()):
            key_mask = (torch.arange(rows, device=x.device) < conv_rows[:, None])[:, None, None, :]
        for layer in self.layers:
            x = layer(x, key_mask)

        x = F.avg_pool1d(x.transpose(1, 2), kernel_size=2, stride=2).transpose(1, 2)  # (B, rows // 2, d)
        x = self.layer_norm(x)
        keep = torch.arange(x.shape[1], device=x.device) < num_tokens[:, None]  # (B, rows // 2)
        out = x[keep]  # (sum N, d), window-major
        if self.projector is not None:
            out = self.projector(out)
        return out, num_tokens.tolist()

    def load_hf_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load transformers-named weights (bare, "audio_tower." or "model.audio_tower."
        prefixed; other components' keys in a full checkpoint are skipped). Missing or
        unexpected keys and wrong shapes raise."""
        load_exact(self, component_weights(state_dict, _HF_PREFIXES, _AUDIO_KEY), "audio encoder")


_AUDIO_KEY = re.compile(r"^(conv1|conv2|embed_positions|layers|layer_norm|projector)\.")
