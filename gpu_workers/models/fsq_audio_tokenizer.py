"""A discrete audio tokenizer in the style of CosyVoice2's speech tokenizer.

Per clip of 16 kHz mono audio:

    waveform -> 30 s windows of 128-bin log-mel (gpu_workers/preprocess/audio.py)
      -> Qwen2-Audio (Whisper-style) encoder, no projector      (N, d_model), 25 rows a second
      -> fsq_proj: Linear d_model -> D = len(levels), float32    (N, D)
      -> finite scalar quantisation (FSQ)                        (N,) unit ids in [0, prod(levels))

and a clip's units are its windows' units, concatenated. The reference uses levels (3,) * 8:
6,561 units, 25 a second.

FSQ, for dimension i with an odd level count L_i and half_i = (L_i - 1) / 2:

    q_i  = round(tanh(z_i) * half_i)                  in {-half_i .. half_i}
    unit = sum_i (q_i + half_i) * prod_{j<i} L_j      dimension 0 is the least significant digit

Per-dimension rounding is the nearest grid point to tanh(z) * half in L2, since the grid is a
product of 1-D grids. Only odd counts are supported: with an even count half_i is not a whole
number, and FSQ then needs a half-step offset that the reference levels never use.

On disk (`from_dir`): config.json {"model_type": "fsq_audio_tokenizer", "encoder_config": {...
Qwen2-Audio encoder keys}, "levels": [...]} and model.safetensors with "encoder." + the
encoder's bare transformers names, plus "fsq_proj.weight" and "fsq_proj.bias".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from gpu_workers.models.checkpoint_io import load_safetensors, read_json
from gpu_workers.models.hf_weights import load_exact
from gpu_workers.models.qwen2_audio_encoder import AudioEncoderConfig, Qwen2AudioEncoder
from gpu_workers.preprocess.audio import AudioFeatureConfig, LogMelExtractor

MODEL_TYPE = "fsq_audio_tokenizer"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def check_levels(levels: Sequence[int]) -> None:
    if not levels:
        raise ValueError("FSQ levels: need at least one dimension")
    for level in levels:
        if not isinstance(level, int) or isinstance(level, bool) or level < 3 or level % 2 == 0:
            raise ValueError(
                f"FSQ levels must be odd integers >= 3, got {list(levels)}: an even count L has "
                "no level at zero and half = (L - 1) / 2 is not whole, which needs FSQ's "
                "half-step offset (not implemented); L = 1 would carry no information"
            )


@dataclass(frozen=True, slots=True)
class FSQAudioTokenizerConfig:
    encoder: AudioEncoderConfig
    levels: tuple[int, ...]

    def __post_init__(self) -> None:
        check_levels(self.levels)
        if self.encoder.projector_hidden_size is not None:
            raise ValueError("audio tokenizer: the encoder must have no projector (FSQ reads d_model outputs)")
        if self.feature_config.frames_per_window != self.encoder.num_frames:
            raise ValueError(
                f"audio tokenizer: the encoder takes {self.encoder.num_frames} mel frames a window, "
                f"the log-mel extractor gives {self.feature_config.frames_per_window} (30 s)"
            )

    @property
    def num_units(self) -> int:
        return math.prod(self.levels)

    @property
    def feature_config(self) -> AudioFeatureConfig:
        return AudioFeatureConfig(num_mel_bins=self.encoder.num_mel_bins)

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> FSQAudioTokenizerConfig:
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a dict, got {type(config).__name__}")  # noqa: TRY004
        if config.get("model_type") != MODEL_TYPE:
            raise ValueError(f"model_type must be {MODEL_TYPE!r}, got {config.get('model_type')!r}")
        encoder = config.get("encoder_config")
        if not isinstance(encoder, Mapping):
            raise ValueError("audio tokenizer config: encoder_config must be a dict")  # noqa: TRY004
        levels = config.get("levels")
        if not isinstance(levels, list):
            raise ValueError(f"audio tokenizer config: levels must be a list, got {levels!r}")  # noqa: TRY004
        return cls(encoder=AudioEncoderConfig.from_hf(encoder), levels=tuple(levels))


# ---------------------------------------------------------------------------------------------
# FSQ


def _digits(levels: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(halves, strides), each (D,) int64; stride_i = prod_{j<i} L_j."""
    check_levels(levels)
    halves = torch.tensor([(level - 1) // 2 for level in levels], dtype=torch.long, device=device)
    strides = torch.tensor([math.prod(levels[:i]) for i in range(len(levels))], dtype=torch.long, device=device)
    return halves, strides


def fsq_quantize(z: torch.Tensor, levels: Sequence[int]) -> torch.Tensor:
    """z (..., D) -> unit ids (...) int64 in [0, prod(levels)); computed in float32."""
    if z.shape[-1] != len(levels):
        raise ValueError(f"FSQ: z has {z.shape[-1]} dims, levels {list(levels)} want {len(levels)}")
    halves, strides = _digits(levels, z.device)
    q = torch.round(torch.tanh(z.float()) * halves).long()  # (..., D) in [-half, half]
    return ((q + halves) * strides).sum(-1)  # (...)


def fsq_codes_to_levels(units: torch.Tensor, levels: Sequence[int]) -> torch.Tensor:
    """Unit ids (...) -> their levels q (..., D) int64, each in [-half_i, half_i]."""
    halves, strides = _digits(levels, units.device)
    units = units.long()
    if bool(((units < 0) | (units >= math.prod(levels))).any()):
        raise ValueError(f"FSQ: unit ids must lie in [0, {math.prod(levels)})")
    return units[..., None] // strides % (2 * halves + 1) - halves  # (..., D)


# ---------------------------------------------------------------------------------------------
# The tokenizer


class FSQAudioTokenizer(nn.Module):
    def __init__(self, config: FSQAudioTokenizerConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Qwen2AudioEncoder(config.encoder)
        self.fsq_proj = nn.Linear(config.encoder.d_model, len(config.levels))
        self._extractor: LogMelExtractor | None = None

    def forward(self, features: torch.Tensor, valid_frames: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """features (B, n_mels, 3000), valid_frames (B,) -> (sum N,) unit ids in window order,
        and each window's N (the encoder's output_lengths)."""
        hidden, num_tokens = self.encoder(features, valid_frames)  # (sum N, d)
        # float32 whatever the encoder's dtype: a bf16 z would move units across rounding edges
        w, b = self.fsq_proj.weight.float(), self.fsq_proj.bias.float()
        z = F.linear(hidden.float(), w, b)  # (sum N, D)
        return fsq_quantize(z, self.config.levels), num_tokens

    @torch.inference_mode()
    def encode(self, waveforms: Sequence[np.ndarray]) -> list[list[int]]:
        """Mono float32 16 kHz clips -> each clip's unit ids, 25 a second; all windows of all
        clips go through the encoder as one batch."""
        batch = self._extractor_on(self.fsq_proj.weight.device)(waveforms)
        units, num_tokens = self(batch.features, batch.valid_frames)
        flat: list[int] = units.tolist()
        out: list[list[int]] = []
        start = window = 0
        for num_windows in batch.windows_per_clip:
            n = sum(num_tokens[window : window + num_windows])
            out.append(flat[start : start + n])
            start, window = start + n, window + num_windows
        return out

    def _extractor_on(self, device: torch.device) -> LogMelExtractor:
        # built on first use, on whichever device the model has been moved to by then
        if self._extractor is None or self._extractor.device != device:
            self._extractor = LogMelExtractor(self.config.feature_config, device)
        return self._extractor

    @classmethod
    def from_dir(
        cls, path: Path | str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> FSQAudioTokenizer:
        """Load config.json + model.safetensors; the encoder in dtype, fsq_proj in float32."""
        path = Path(path)
        config = FSQAudioTokenizerConfig.from_hf(read_json(path / CONFIG_FILE))
        # built on meta: no memory or time spent on a random init that the weights overwrite
        with torch.device("meta"):
            model = cls(config)
        model.encoder.to(dtype)
        model = model.to_empty(device=device)
        load_exact(model, load_safetensors(path), "audio tokenizer")
        return model.eval()


# ---------------------------------------------------------------------------------------------
# A tiny random checkpoint for tests

_TINY_ENCODER: dict[str, Any] = {
    "num_mel_bins": 128,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "d_model": 32,
    "max_source_positions": 1500,
    "activation_function": "gelu",
}


# Weight gains over noise / sqrt(fan_in). The log-mel moves by only ~0.15 around its mean
# within a window (Whisper's (x + 4) / 4 scale): conv1's gain brings that to about unit size,
# conv2's makes up for the GELU before it, which passes little of a negative half.
_GAINS = {"encoder.conv1.weight": 8.0, "encoder.conv2.weight": 2.0}


def make_tiny_audio_tokenizer(out_dir: Path, *, seed: int = 0, levels: tuple[int, ...] = (3, 3, 3, 3)) -> Path:
    """Write config.json + model.safetensors of a tiny random tokenizer into out_dir; the same
    arguments give the same bytes."""
    raw = {"model_type": MODEL_TYPE, "encoder_config": dict(_TINY_ENCODER), "levels": list(levels)}
    config = FSQAudioTokenizerConfig.from_hf(raw)
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in FSQAudioTokenizer(config).state_dict().items()}

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in sorted(shapes.items()):
        noise = torch.randn(shape, generator=gen)
        if "layer_norm" in name and name.endswith("weight"):
            tensors[name] = 1.0 + 0.1 * noise  # near one, but not one, so a missed norm shows
        elif name.endswith("bias"):
            tensors[name] = 0.1 * noise
        elif name.endswith("embed_positions.weight"):
            tensors[name] = 0.1 * noise  # small: units should follow the audio, not the position
        else:
            # noise / sqrt(fan_in) keeps activations about unit size; on fsq_proj that puts
            # z ~ N(0, 1) after the final layer norm, so all three FSQ levels are common
            tensors[name] = _GAINS.get(name, 1.0) * noise / math.sqrt(math.prod(shape[1:]))
    # zero-mean conv1 filters ignore the log-mel's overall level, which barely changes within
    # a window: with it, every frame shares one large offset and units hardly change over time
    conv1 = tensors["encoder.conv1.weight"]  # (d, n_mels, 3)
    tensors["encoder.conv1.weight"] = conv1 - conv1.mean(dim=(1, 2), keepdim=True)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    (out_dir / CONFIG_FILE).write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    return out_dir
