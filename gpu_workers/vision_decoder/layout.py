"""The vision decoder's checkpoint directory, in either of its two layouts (told apart by
model_index.json): what VisionDecoder reads beside the models' own folders.

The published one: `decoder/vision/` of HyperCLOVAX-SEED-Omni-8B, a diffusers pipeline folder
(the reference's VisionTokenToImagePipeline), read in place:

    decoder/vision/
      model_index.json            names the components; transformer2 optional (null or absent)
      transformer/                VisionTransformer config.json + diffusion_pytorch_model
                                  .safetensors (or a sharded index): the DiT (models/flux_dit.py)
      transformer2/               the weak twin: autoguidance, default scale 0.75 (the
                                  reference's HTTP API); without it no guidance at all
      token_embedder/             VisionTokenEmbedder config.json {vocab_size, embedding_dim,
                                  token_length} + weights: buffer "vocab_embeddings" is the
                                  codebook; "uncond_embedding" is never used (no CFG there);
                                  the code grid is sqrt(token_length) square
      vae/, scheduler/            as below; the scheduler must not ask for dynamic shifting
                                  (the reference calls set_timesteps(N) without mu, which
                                  diffusers refuses then), so its static shift is what runs

Ours: the `vision_decoder/` directory of an omni checkpoint.

    vision_decoder/
      config.json                 {"model_type": "omni_vision_decoder",
                                   "code_grid": [rows, cols],        27 x 27 in the reference
                                   "guidance": "autoguidance" | "cfg" | "none",
                                   "guidance_scale": 0.75}           the default scale
      codebook.safetensors        "codebook" (num_codes, cond_channels): the image tokenizer's
                                  codebook embeddings, the rows the codes index
      transformer/                the DiT: FluxDiT config.json + model.safetensors (ours or
                                  diffusers' names and config, see models/flux_dit.py)
      weak_transformer/           "autoguidance" only: the weak twin, a smaller FluxDiT with the
                                  same latent, condition and patch sizes
      uncond.safetensors          "cfg" only: "embedding" (cond_channels,), the unconditional
                                  code embedding: every grid cell gets it, and vec is it
      vae/                        diffusers AutoencoderKL config.json and
                                  diffusion_pytorch_model.safetensors (the decoder half is read)
      scheduler/scheduler_config.json   diffusers FlowMatchEulerDiscreteScheduler config

"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from gpu_workers.models.checkpoint_io import read_json
from gpu_workers.models.flow_match import FlowMatchSchedule
from omni.shared.settings import json_key, read_json_config, to_json_config

MODEL_TYPE = "omni_vision_decoder"
CODEBOOK_FILE = "codebook.safetensors"
UNCOND_FILE = "uncond.safetensors"
WEAK_DIR = "weak_transformer"
# the published diffusers pipeline folder
PIPELINE_INDEX = "model_index.json"
PIPELINE_WEAK_DIR = "transformer2"
PIPELINE_COMPONENTS = ("transformer", "vae", "scheduler", "token_embedder")  # required; transformer2 optional
PIPELINE_WEIGHTS = "diffusion_pytorch_model.safetensors"
REFERENCE_GUIDANCE_SCALE = 0.75  # the reference's HTTP API default (its pipeline's is 0)
GUIDANCE_MODES = ("autoguidance", "cfg", "none")  # vision_decoder.GUIDANCE has a class for each


def _code_grid(key: str, grid: Any) -> tuple[int, int]:
    if (
        not isinstance(grid, list | tuple)
        or len(grid) != 2
        or any(not isinstance(n, int) or isinstance(n, bool) or n <= 0 for n in grid)
    ):
        raise ValueError(f"vision decoder config: code_grid must be [rows, cols] of positive ints, got {grid!r}")
    if grid[0] != grid[1]:
        # condition_from_codes lays the codes out on a square grid, as TA-Tok emits them
        raise ValueError(f"vision decoder config: code_grid {list(grid)} is not square")
    return (grid[0], grid[1])


def _guidance(key: str, guidance: Any) -> str:
    if guidance not in GUIDANCE_MODES:
        raise ValueError(f"vision decoder config: guidance {guidance!r} is not one of {', '.join(GUIDANCE_MODES)}")
    return str(guidance)


def _guidance_scale(key: str, scale: Any) -> float:
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale) or scale < 0:
        raise ValueError(f"vision decoder config: guidance_scale must be a number >= 0, got {scale!r}")
    return float(scale)


@dataclass(frozen=True, slots=True)
class VisionDecoderConfig:
    code_grid: tuple[int, int] = json_key(read=_code_grid)  # (rows, cols) of codes per image
    guidance: str = json_key(read=_guidance)  # one of GUIDANCE_MODES
    guidance_scale: float = json_key(read=_guidance_scale)  # the default when a job gives none

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> VisionDecoderConfig:
        if raw.get("model_type") != MODEL_TYPE:
            raise ValueError(f"vision decoder config: model_type {raw.get('model_type')!r} is not {MODEL_TYPE}")
        if raw.get("guidance") == "none":
            raw = {"guidance_scale": 0.0, **raw}  # required but for "none", which has no scale
        return read_json_config(cls, raw, what="vision decoder config", strict=False)

    def to_dict(self) -> dict[str, Any]:
        return to_json_config(self, model_type=MODEL_TYPE)

    @property
    def num_codes_per_image(self) -> int:
        return self.code_grid[0] * self.code_grid[1]


@dataclass(frozen=True, slots=True)
class DecoderFolder:
    """A vision decoder directory, read: its config, codebook and schedule, and where the weak
    twin is (read by the autoguidance mode). The models' folders (transformer/, vae/) are
    read by their own classes."""

    path: Path
    config: VisionDecoderConfig
    codebook: torch.Tensor  # (num_codes, cond)
    schedule: FlowMatchSchedule
    weak_dir: Path

    @classmethod
    def read(cls, path: Path, device: torch.device) -> DecoderFolder:
        published = (path / PIPELINE_INDEX).is_file()
        if published:
            config, codebook = _read_pipeline_folder(path, device)
        else:
            config, codebook = _read_omni_folder(path, device)
        schedule = FlowMatchSchedule.from_config(read_json(path / "scheduler" / "scheduler_config.json"))
        if published and schedule.use_dynamic_shifting:
            raise ValueError(
                f"{path / 'scheduler'}: use_dynamic_shifting is on, but the reference calls "
                "set_timesteps(steps) without mu, which diffusers refuses; this folder cannot be run as published"
            )
        return cls(path, config, codebook, schedule, path / (PIPELINE_WEAK_DIR if published else WEAK_DIR))


def _read_omni_folder(path: Path, device: torch.device) -> tuple[VisionDecoderConfig, torch.Tensor]:
    """Our layout's config.json and codebook."""
    config = VisionDecoderConfig.from_dict(read_json(path / "config.json"))
    if not (path / CODEBOOK_FILE).is_file():
        raise ValueError(f"{path}: no {CODEBOOK_FILE}")
    codebook = load_file(path / CODEBOOK_FILE, device=str(device)).get("codebook")
    if codebook is None:
        raise ValueError(f"{path / CODEBOOK_FILE}: no 'codebook' tensor")
    return config, codebook


def _read_pipeline_folder(path: Path, device: torch.device) -> tuple[VisionDecoderConfig, torch.Tensor]:
    """The published folder's equivalent of our config.json and codebook: model_index.json
    decides the guidance (autoguidance at the reference API's 0.75 with transformer2, none
    without), token_embedder/ gives the code grid and the codebook."""
    index = read_json(path / PIPELINE_INDEX)

    def listed(name: str) -> bool:
        # diffusers writes an absent optional component as [null, null]
        entry = index.get(name)
        return isinstance(entry, list) and len(entry) == 2 and entry[1] is not None

    missing = [name for name in PIPELINE_COMPONENTS if not listed(name)]
    if missing:
        raise ValueError(f"{path / PIPELINE_INDEX}: no {', '.join(missing)}")
    weak = listed(PIPELINE_WEAK_DIR)
    if weak and not (path / PIPELINE_WEAK_DIR).is_dir():
        raise ValueError(f"{path / PIPELINE_INDEX} names {PIPELINE_WEAK_DIR}, but that folder is missing")

    embedder_dir = path / "token_embedder"
    raw = read_json(embedder_dir / "config.json")
    # the reference's VisionTokenEmbedder defaults, for keys its config leaves out
    defaults = {"vocab_size": 65536, "embedding_dim": 1536, "token_length": 729}
    sizes = {key: raw.get(key, default) for key, default in defaults.items()}
    bad = [k for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
    if bad:
        raise ValueError(f"{embedder_dir / 'config.json'}: {', '.join(bad)} must be positive ints")
    side = math.isqrt(sizes["token_length"])
    if side * side != sizes["token_length"]:
        # the reference lays the codes out on a sqrt(token_length) square
        raise ValueError(f"{embedder_dir / 'config.json'}: token_length {sizes['token_length']} is not a square")
    weights = embedder_dir / PIPELINE_WEIGHTS
    if not weights.is_file():
        raise ValueError(f"{embedder_dir}: no {PIPELINE_WEIGHTS}")
    with safe_open(str(weights), framework="pt", device=str(device)) as f:
        if "vocab_embeddings" not in f.keys():  # noqa: SIM118 - safe_open is not a dict
            raise ValueError(f"{weights}: no 'vocab_embeddings' tensor")
        codebook = f.get_tensor("vocab_embeddings")  # uncond_embedding is not read: nothing uses it
    want = (sizes["vocab_size"], sizes["embedding_dim"])
    if tuple(codebook.shape) != want:
        raise ValueError(f"{weights}: vocab_embeddings {tuple(codebook.shape)}, config says {want}")
    if weak:
        config = VisionDecoderConfig((side, side), "autoguidance", REFERENCE_GUIDANCE_SCALE)
    else:
        config = VisionDecoderConfig((side, side), "none", 0.0)
    return config, codebook
