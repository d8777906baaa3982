"""The tiny decoder/vision/ folder: the files the published one has, components diffusers
itself loads (the VAE, the scheduler), the codebook where the reference reads it, and the
same bytes from the same arguments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler
from safetensors.torch import load_file

from gpu_workers.tiny.published_vision_decoder import make_tiny_published_vision_decoder

CODEBOOK = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))


def make(path: Path, use_patchify: bool = True) -> Path:
    return make_tiny_published_vision_decoder(
        path, seed=1, codebook=CODEBOOK, code_grid=(8, 8), use_patchify=use_patchify
    )


def test_the_folder_is_laid_out_as_published(tmp_path: Path) -> None:
    root = make(tmp_path / "vision")
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == [
        "model_index.json",
        "scheduler/scheduler_config.json",
        "token_embedder/config.json", "token_embedder/diffusion_pytorch_model.safetensors",
        "transformer/config.json", "transformer/diffusion_pytorch_model.safetensors",
        "transformer2/config.json", "transformer2/diffusion_pytorch_model.safetensors",
        "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
    ]  # fmt: skip
    index = json.loads((root / "model_index.json").read_text())
    assert index["_class_name"] == "VisionTokenToImagePipeline"
    assert {k for k in index if not k.startswith("_")} == {
        "transformer",
        "transformer2",
        "vae",
        "scheduler",
        "token_embedder",
    }

    embedder = json.loads((root / "token_embedder/config.json").read_text())
    assert (embedder["vocab_size"], embedder["embedding_dim"], embedder["token_length"]) == (64, 16, 64)
    buffers = load_file(root / "token_embedder/diffusion_pytorch_model.safetensors")
    assert torch.equal(buffers["vocab_embeddings"], CODEBOOK)
    assert buffers["uncond_embedding"].shape == (1, 16)

    strong = json.loads((root / "transformer/config.json").read_text())
    weak = json.loads((root / "transformer2/config.json").read_text())
    assert strong["_class_name"] == weak["_class_name"] == "VisionTransformer"
    assert (strong["depth"], strong["depth_single_blocks"], weak["depth_single_blocks"]) == (0, 2, 1)
    assert (strong["in_channels"], strong["context_in_dim"], strong["use_patchify"]) == (64, 16, True)
    unpacked = json.loads((make(tmp_path / "unpacked", use_patchify=False) / "transformer/config.json").read_text())
    assert (unpacked["in_channels"], unpacked["use_patchify"]) == (16, False)
    names = set(load_file(root / "transformer/diffusion_pytorch_model.safetensors"))
    assert {"img_in.weight", "single_blocks.1.norm.query_norm.scale", "final_layer.adaLN_modulation.1.weight"} <= names
    assert load_file(root / "transformer/diffusion_pytorch_model.safetensors")["img_in.weight"].shape == (32, 64 + 16)


def test_diffusers_loads_its_vae_and_scheduler_with_every_weight(tmp_path: Path) -> None:
    root = make(tmp_path / "vision")
    config = {k: v for k, v in json.loads((root / "vae/config.json").read_text()).items() if not k.startswith("_")}
    vae: Any = AutoencoderKL(**config)  # Any: mypy cannot see through diffusers' mixins
    want = {k: tuple(v.shape) for k, v in vae.state_dict().items()}
    stored = load_file(root / "vae/diffusion_pytorch_model.safetensors")
    assert {k: tuple(v.shape) for k, v in stored.items()} == want  # the encoder half too
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(root / "scheduler")
    scheduler.set_timesteps(4)  # no mu: dynamic shifting is off, as the reference needs


def test_same_arguments_same_bytes(tmp_path: Path) -> None:
    a, b = make(tmp_path / "a"), make(tmp_path / "b")
    for path in sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file()):
        assert (a / path).read_bytes() == (b / path).read_bytes(), path


def test_the_grid_must_be_square(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="square"):
        make_tiny_published_vision_decoder(tmp_path, seed=0, codebook=CODEBOOK, code_grid=(8, 4))
