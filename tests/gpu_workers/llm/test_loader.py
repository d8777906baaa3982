from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpu_workers.attention.backend import SequenceChunk
from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from gpu_workers.llm.loader import _hf_name, load_model
from gpu_workers.models.int8_linear import Int8Linear, onednn_available, quantize_linears
from gpu_workers.models.llama import LlamaForCausalLM
from gpu_workers.models.registry import MergedLinear
from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from tests.gpu_workers.conftest import VOCAB

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


@pytest.mark.parametrize("kernel", ["aten", "onednn"])
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "granite"])
def test_int8_model_equals_transformers_on_its_dequantized_weights(
    model_type: str, kernel: str, hf_checkpoint: Any
) -> None:
    """--quantization int8: every Linear of the decoder in int8 (per-channel scales), and the
    same model in transformers with each of those weights replaced by int8 * scale. The kernel
    runs in float32 here (serving on CPU rounds float32 activations to bf16 for it, which
    would hide a wrong weight behind bf16's noise; the SmolLM2 test measures that path);
    worst logit difference measured 1.7e-6 (llama: tied head, llama3 RoPE; qwen2: q/k/v biases;
    granite: every bias, muP), against 7e-3 to 5.4e-2 from the unquantized weights. oneDNN's
    kernel (what a VNNI CPU serves) takes the float32 activations split in two int8 parts,
    about 16 bits a row: worst measured 1.7e-4 (granite 4.0e-5). q|k|v and the down projections stay float
    in both (the model's INT8_KEEP)."""
    if kernel == "onednn" and not onednn_available():
        pytest.skip("oneDNN's int8 GEMM needs an x86 CPU with VNNI")
    path, hf = hf_checkpoint(model_type)
    ours = load(path)
    quantize_linears(
        ours, compute_dtype=torch.float32 if kernel == "aten" else None, kernel=kernel, keep=ours.INT8_KEEP
    )
    reference = copy.deepcopy(hf)
    hf_params = dict(reference.named_parameters())
    quantized = [(n, m) for n, m in ours.named_modules() if isinstance(m, Int8Linear)]
    assert len(quantized) == 2 * ours.config.num_layers + (0 if ours.config.tie_word_embeddings else 1)
    assert all(m.kernel == kernel for _, m in quantized)
    with torch.no_grad():
        for name, module in quantized:
            weight = module.dequantized_weight()
            sizes = module_shard_sizes(hf, name)
            for shard, rows in enumerate(weight.split(sizes)):
                hf_name = _hf_name(f"{name}.weight", shard if len(sizes) > 1 else None, LlamaForCausalLM.STACKED_PARAMS)
                hf_params[hf_name].copy_(rows)
    ids = torch.arange(3, 40) % VOCAB
    with torch.inference_mode():
        metadata = ours.layers[0].self_attn.backend.build_metadata([SequenceChunk(0, len(ids), 0, [])])
        got = ours.compute_logits(ours(ids, torch.arange(len(ids)), None, metadata))
        want = reference(ids[None]).logits[0].float()
        unquantized = hf(ids[None]).logits[0].float()
    worst = (got - want).abs().max().item()
    print(
        f"{model_type}: worst |int8 - dequantized float| {worst:.1e}, from the float weights {(got - unquantized).abs().max().item():.1e}"
    )
    assert worst < (2e-5 if kernel == "aten" else 1e-3)
    assert (got - unquantized).abs().max().item() > 100 * worst  # the weights really were quantized


def module_shard_sizes(hf: Any, name: str) -> tuple[int, ...]:
    """How many rows each checkpoint tensor fills of our module `name` (q|k|v, gate|up, or one)."""
    parent, _, fused = name.rpartition(".")
    parts = [k for k, v in sorted(LlamaForCausalLM.STACKED_PARAMS.items(), key=lambda kv: kv[1][1]) if v[0] == fused]
    if not parts:
        return (hf.get_parameter(_hf_name(f"{name}.weight", None, LlamaForCausalLM.STACKED_PARAMS)).shape[0],)
    return tuple(hf.get_parameter(f"model.{parent}.{part}.weight").shape[0] for part in parts)


def test_int8_on_a_device_without_its_kernel_is_refused_before_loading(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpu_workers.models.int8_linear._has_kernel", lambda key: key == "CPU")  # a CPU-only torch
    backend = TorchSDPABackend(4, CPU)
    with pytest.raises(ValueError, match="no cuda kernel for aten::_weight_int8pack_mm"):
        load_model(
            checkpoint, device=torch.device("cuda:0"), dtype=torch.bfloat16, backend=backend, quantization="int8"
        )
    with pytest.raises(ValueError, match="unknown quantization 'int4'"):
        load_model(checkpoint, device=CPU, dtype=torch.float32, backend=backend, quantization="int4")
    assert not any(isinstance(m, Int8Linear) for m in load(checkpoint).modules())  # without: float Linears
    served = load_model(checkpoint, device=CPU, dtype=torch.float32, backend=backend, quantization="int8")
    assert (
        sum(isinstance(m, Int8Linear) for m in served.modules()) == 2 * served.config.num_layers + 1
    )  # o, gate|up, untied head
