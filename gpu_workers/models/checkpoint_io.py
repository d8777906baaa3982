"""Checkpoint files as every loader reads them: a config.json-like JSON object, and the tensors
of a (possibly sharded) safetensors checkpoint. Never pickle (.bin, .pt).

Model modules read their own checkpoints through this module; the LLM's loader
(gpu_workers/llm/loader.py) and the encoder's component files build on it. It knows no model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file; ValueError naming the file when it is missing or malformed."""
    if not path.is_file():
        raise ValueError(f"{path.parent}: no {path.name}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: want a JSON object")
    return raw


def checkpoint_files(model_dir: Path) -> list[Path]:
    """model.safetensors, or every shard a model.safetensors.index.json names (each once,
    sorted); ValueError naming what is missing, and refusing pickle weights."""
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: no weight_map")
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise ValueError(f"{index}: shard files not found: {', '.join(missing)}")
        return [model_dir / n for n in names]
    if any(model_dir.glob("*.bin")) or any(model_dir.glob("*.pt")):
        raise ValueError(f"{model_dir}: only pickle weights (.bin/.pt) found; convert them to safetensors")
    raise ValueError(f"{model_dir}: neither {SINGLE_FILE} nor {INDEX_FILE} found")


def load_safetensors(model_dir: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of a (possibly sharded) safetensors checkpoint, by its stored name."""
    tensors: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                tensors[name] = f.get_tensor(name)
    return tensors
