from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from gpu_workers.loader import load_model
from gpu_workers.models.llama import LlamaForCausalLM, MergedLinear
from gpu_workers.tiny.checkpoints import make_tiny_checkpoint

CPU = torch.device("cpu")


def load(model_dir: Path, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    return load_model(model_dir, device=CPU, dtype=dtype, backend=TorchSDPABackend(4, CPU))


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return make_tiny_checkpoint(tmp_path / "ckpt", "qwen2")


def rewrite(model_dir: Path, edit: dict[str, torch.Tensor | None]) -> None:
    tensors = load_file(model_dir / "model.safetensors")
    for name, value in edit.items():
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})


def test_fuses_qkv_and_converts_dtype(checkpoint: Path) -> None:
    model = load(checkpoint, torch.bfloat16)
    tensors = load_file(checkpoint / "model.safetensors")
    qkv = model.get_submodule("layers.1.self_attn.qkv_proj")
    assert isinstance(qkv, MergedLinear) and qkv.bias is not None
    assert qkv.weight.dtype == torch.bfloat16
    expected = torch.cat([tensors[f"model.layers.1.self_attn.{p}_proj.bias"] for p in "qkv"])
    torch.testing.assert_close(qkv.bias, expected.to(torch.bfloat16))


def test_missing_tensor(checkpoint: Path) -> None:
    rewrite(checkpoint, {"model.layers.0.self_attn.k_proj.weight": None, "model.norm.weight": None})
    with pytest.raises(ValueError, match=r"missing .*model.layers.0.self_attn.k_proj.weight, model.norm.weight"):
        load(checkpoint)


def test_unexpected_tensor(checkpoint: Path) -> None:
    rewrite(checkpoint, {"model.layers.0.mystery.weight": torch.zeros(2), "vision.proj": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"unexpected .*model.layers.0.mystery.weight, vision.proj"):
        load(checkpoint)


def test_shape_mismatch(checkpoint: Path) -> None:
    rewrite(checkpoint, {"model.layers.1.mlp.up_proj.weight": torch.zeros(3, 64)})
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.up_proj.weight: shape \(3, 64\) .* \(128, 64\)"):
        load(checkpoint)


def test_unknown_model_type(checkpoint: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps(config | {"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        load(checkpoint)


def test_pickle_weights_are_refused(tmp_path: Path, checkpoint: Path) -> None:
    (checkpoint / "model.safetensors").rename(checkpoint / "pytorch_model.bin")
    with pytest.raises(ValueError, match="pickle"):
        load(checkpoint)
    with pytest.raises(ValueError, match="no config.json"):
        load(tmp_path)
