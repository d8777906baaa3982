"""A stand-in for gpu_workers/models/ecapa_tdnn.py, for the tests of the zero-shot path while
that module is written elsewhere: the same interface (EcapaConfig, EcapaTdnn with
load_reference_state_dict and forward(mel) -> (B, embed_dim), ReferenceMelConfig,
reference_mel, random_reference_state_dict), none of ECAPA-TDNN's computation. `install`
gives the real module when it imports, else puts this one in sys.modules for the test."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

NAME = "gpu_workers.models.ecapa_tdnn"


@dataclass(frozen=True)
class EcapaConfig:
    num_mels: int
    hidden: int
    embed_dim: int

    @classmethod
    def from_vocoder_config(cls, h: Mapping[str, Any]) -> EcapaConfig:
        return cls(h["num_mels"], h["spk_hidden_dim"], h["spk_emb_dim"])


class EcapaTdnn(nn.Module):
    def __init__(self, config: EcapaConfig) -> None:
        super().__init__()
        self.conv = nn.Conv1d(config.num_mels, config.hidden, 1)
        self.linear = nn.Linear(config.hidden, config.embed_dim)

    def load_reference_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.load_state_dict(dict(state), strict=True)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.relu(self.conv(mel)).mean(dim=-1))


@dataclass(frozen=True)
class ReferenceMelConfig:
    num_mels: int
    n_fft: int
    hop_size: int

    @classmethod
    def from_vocoder_config(cls, h: Mapping[str, Any]) -> ReferenceMelConfig:
        return cls(h["num_mels"], h["n_fft"], h["hop_size"])


def reference_mel(wave: np.ndarray, sample_rate: int, cfg: ReferenceMelConfig) -> torch.Tensor:
    if wave.size < cfg.n_fft:
        raise ValueError("reference audio too short")
    frames = np.lib.stride_tricks.sliding_window_view(wave, cfg.n_fft)[:: cfg.hop_size]
    power = np.abs(np.fft.rfft(frames, axis=-1)) ** 2  # (T, F)
    bands = np.array_split(power, cfg.num_mels, axis=-1)
    mel = np.log(np.stack([b.mean(axis=-1) for b in bands]) + 1e-5)  # (M, T)
    return torch.from_numpy(mel.astype(np.float32))[None]


def random_reference_state_dict(config: EcapaConfig, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = EcapaTdnn(config).state_dict()
    return {name: 0.1 * torch.randn(t.shape, generator=gen) for name, t in sorted(shapes.items())}


def install(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The real module if it imports, else this stand-in, put where the product code imports it
    (undone with the monkeypatch)."""
    try:
        return importlib.import_module(NAME)
    except ImportError:
        module = types.ModuleType(NAME)
        for name in ("EcapaConfig", "EcapaTdnn", "ReferenceMelConfig", "reference_mel", "random_reference_state_dict"):
            setattr(module, name, globals()[name])
        monkeypatch.setitem(sys.modules, NAME, module)
        from gpu_workers import models

        monkeypatch.setattr(models, "ecapa_tdnn", module, raising=False)
        return module
