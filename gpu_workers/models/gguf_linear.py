"""Linear layers on a GGUF file's quantized blocks, kept as the file holds them (--quantization gguf).

Q8_0 (an fp16 scale and 32 int8 a block), Q4_0 (a scale and 32 nibbles, value d (q - 8)) and
Q4_1 (a scale, a minimum and 32 nibbles, value d q + m) weights are laid out once for streaming
(small_m_linear.cpp's pack_gguf: the bytes stay the file's, moved into VNNI order) and served by
its integer kernels at every M: each row of x is quantized per block of 32 to int8, as
llama.cpp's CPU backend does, and dotted with the blocks' integers by AVX512-VNNI. SmolLM2's
Q4_1 file then holds 96 MB of linear weights (its Q8_0 embedding table doubling as the output
projection) where the dequantized bf16 model holds 270.

Where each module comes from: gpu_workers/llm/loader.py (keep_gguf_blocks) swaps a linear whose
file tensors are all of these types for a GgufLinear; any other type (Q4_K, Q6_K, F16, ...)
stays dequantized in --dtype, as without the flag.
"""

from __future__ import annotations

import torch
from torch import nn

from gpu_workers.models import small_m_linear

KINDS = ("q8_0", "q4_0", "q4_1")


def unavailable() -> str | None:
    """None where this CPU runs the GGUF block kernels, else why not (a sentence)."""
    if not small_m_linear.load():
        return "the small-M kernels are not built here (no C++ compiler or no x86 CPU)"
    if not bool(torch.ops.omni_small_m.gguf_kernels()):
        return "the GGUF block kernels need AVX512-VNNI and F16C, which this CPU lacks"
    return None


class GgufLinear(nn.Module):
    """y = x @ W.T + bias, W held as GGUF blocks (`kind`: q8_0, q4_0 or q4_1)."""

    small: torch.Tensor  # the packed blocks (small_m_linear.cpp's GGUF layout), uint8
    small_bias: torch.Tensor | None  # (N,) float32

    def __init__(self, raw: torch.Tensor, kind: str, in_features: int, bias: torch.Tensor | None = None) -> None:
        """raw: (N, in_features / 32 * block bytes) uint8, the file's rows of blocks, in the order
        the model's output channels take."""
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"GGUF blocks of {kind!r} are not served kept quantized (only {', '.join(KINDS)})")
        if in_features % 32:
            raise ValueError(f"GGUF blocks span 32 inputs; {in_features} is no multiple of 32")
        self.kind = kind
        self.in_features = in_features
        self.out_features = raw.shape[0]
        self.small = small_m_linear.pack_gguf(raw.contiguous(), kind)
        self.small_bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = small_m_linear.linear(rows, self.small, self.out_features, bias=self.small_bias, out_dtype=x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def small_m_form(self) -> tuple[torch.Tensor, None, torch.Tensor | None]:
        return self.small, None, self.small_bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, GGUF {self.kind} blocks"
