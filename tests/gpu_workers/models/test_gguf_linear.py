"""GGUF blocks kept quantized (models/gguf_linear.py, small_m_linear.cpp's pack_gguf and VNNI
kernels) against two references on the same blocks (gguf's own quantize and dequantize):

- the kernels' arithmetic, emulated in float64 (x quantized per 32 as the kernel does it, times
  the dequantized weight): equal within float32 summation, 2e-6 of the terms' sum;
- the float product with the dequantized weight: within the activations' own rounding, at most
  sum_k |w_k| dx_g / 2 (x's int8 step dx_g = max|x| / 127 over its block of 32).

Then the loader (--quantization gguf) on SmolLM2's Q4_1 file: which layers it keeps as blocks,
and greedy agreement with the same file dequantized to float32, teacher-forced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_workers.models import gguf_linear
from gpu_workers.models.gguf_linear import GgufLinear

pytestmark = pytest.mark.skipif(gguf_linear.unavailable() is not None, reason=str(gguf_linear.unavailable()))

SHAPES = [(100, 64), (7, 576), (65, 32), (130, 1536)]  # N no multiple of 16 or 64; K of 32


def quantized(n: int, k: int, kind: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random weights as GGUF blocks of `kind`: (raw rows, their dequantized float32 values)."""
    import gguf

    kinds = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
             "q4_1": gguf.GGMLQuantizationType.Q4_1}  # fmt: skip
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.1
    w[:, :32] += 0.05  # Q4_1's minimums non-zero
    raw = gguf.quantize(w, kinds[kind])
    return torch.from_numpy(np.ascontiguousarray(raw)), torch.from_numpy(gguf.dequantize(raw, kinds[kind]).copy())


def x_blocks(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """x (M, K) as the kernel quantizes it: int8 values and the step of each block of 32."""
    xb = x.double().numpy().reshape(x.shape[0], -1, 32)
    step = np.abs(xb).max(-1, keepdims=True).astype(np.float32) / np.float32(127)
    inv = np.where(step > 0, 1 / step.astype(np.float32), 0).astype(np.float32)
    q = np.rint(xb.astype(np.float32) * inv)
    return q, step.astype(np.float64)


def block_parts(raw: torch.Tensor, kind: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tensor's blocks as the file holds them: scales d, minimums m (N, K / 32) and integers
    (N, K / 32, 32), value d * integer + m (q8_0: m = 0; q4_0: m = -8 d)."""
    blocks = raw.numpy().reshape(n, k // 32, -1)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    if kind == "q8_0":
        return d, np.zeros_like(d), blocks[..., 2:].copy().view(np.int8).astype(np.float64)
    if kind == "q4_1":
        m, nibbles = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64), blocks[..., 4:]
    else:
        m, nibbles = -8 * d, blocks[..., 2:]
    return d, m, np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).astype(np.float64)


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_blocks_match_their_arithmetic_and_the_float_product(kind: str, n: int, k: int, rows: int) -> None:
    raw, weight = quantized(n, k, kind, seed=n + k)
    d, m, ints = block_parts(raw, kind, n, k)
    assert np.allclose(d[..., None] * ints + m[..., None], weight.double().numpy().reshape(n, -1, 32), rtol=1e-6, atol=0)
    bias = torch.randn(n)
    x = torch.randn(rows, k) * torch.linspace(0.1, 3, k)  # blocks of different scales
    got = GgufLinear(raw, kind, k, bias)(x).double().numpy() - bias.double().numpy()
    # the kernel's arithmetic: the integers' dot products and sums times the scales, which is the
    # dequantized weight times x as quantized (d q + m exact in float32)
    q, step = x_blocks(x)
    emulated = np.einsum("ngk,mgk->mn", d[..., None] * ints + m[..., None], q * step)
    terms = np.einsum("ngk,mgk->mn", np.abs(d[..., None] * ints) + np.abs(m[..., None]), np.abs(q * step))
    assert (np.abs(got - emulated) <= 2e-6 * terms + 1e-6).all()
    # the float product: only x's rounding to its int8 step (at most half of it) separates them
    reference = (x.double() @ weight.double().T).numpy()
    bound = np.einsum("ngk,mg->mn", np.abs(weight.double().numpy().reshape(n, -1, 32)), step[..., 0] / 2)
    assert (np.abs(got - reference) <= bound + 2e-6 * terms + 1e-6).all()


def test_out_dtype_follows_x_and_shapes_are_checked() -> None:
    raw, _ = quantized(20, 64, "q8_0", seed=1)
    layer = GgufLinear(raw, "q8_0", 64)
    assert layer(torch.randn(2, 3, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert layer(torch.randn(5, 64)).shape == (5, 20)
    with pytest.raises(ValueError, match="no multiple of 32"):
        GgufLinear(raw, "q8_0", 48)
    with pytest.raises(ValueError, match="not served kept quantized"):
        GgufLinear(raw, "q6_k", 64)


def test_the_loader_keeps_smollm2s_blocks_and_agrees_with_the_float_model(smollm2_gguf: Path) -> None:
    """Every linear layer of SmolLM2's Q4_1 file (and its Q8_0 embedding as the output
    projection) kept as blocks; teacher-forced over 3 chat prompts and 32 of the float model's
    greedy tokens, the top-1 token agrees with the same file dequantized to float32 (measured
    over 64 prompts x 128 tokens in docs/BENCHMARKS.md, session 15)."""
    from gpu_workers.attention.backend import SequenceChunk
    from gpu_workers.attention.torch_sdpa import TorchSDPABackend
    from gpu_workers.llm.loader import load_model
    from omni.text.tokenizer import TextTokenizer

    cpu = torch.device("cpu")
    kept = load_model(smollm2_gguf, device=cpu, dtype=torch.float32, backend=TorchSDPABackend(16, cpu), quantization="gguf")
    plain = load_model(smollm2_gguf, device=cpu, dtype=torch.float32, backend=TorchSDPABackend(16, cpu))
    blocks = [m for m in kept.modules() if isinstance(m, GgufLinear)]
    assert len(blocks) == 4 * kept.config.num_layers + 1
    assert {m.kind for m in blocks} == {"q4_1", "q8_0"} and isinstance(kept.lm_head, GgufLinear)
    assert not any(isinstance(m, torch.nn.Linear) for m in kept.modules())
    held = sum(m.small.numel() for m in blocks)
    assert held < 0.4 * sum(p.numel() * 4 for p in plain.parameters()) / 2  # under 40 % of bf16's bytes

    tokenizer = TextTokenizer.from_gguf(smollm2_gguf)
    backend = TorchSDPABackend(16, cpu)

    def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
        meta = backend.build_metadata([SequenceChunk(0, len(ids), 0, [])])
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), None, meta))  # type: ignore[operator]

    agree = total = 0
    new = 32
    for question in ("What is the capital of France?", "Write a haiku about the sea.", "Why is the sky blue?"):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}])
        with torch.no_grad():
            for _ in range(new):  # the float model's greedy continuation
                ids.append(int(logits(plain, ids)[-1].argmax()))
            a = logits(kept, ids).argmax(-1)[-new - 1 : -1]
            b = logits(plain, ids).argmax(-1)[-new - 1 : -1]
        agree += int((a == b).sum())
        total += new
    assert agree / total >= 0.9, f"top-1 agreement {agree}/{total}"
