"""Linear layers with int8 weights and one float scale per output channel (`--quantization int8`).

The scheme is vLLM's tpu_int8 and torchao's Int8WeightOnlyConfig: each weight row w_n is kept
as q_n = round(w_n / s_n) with s_n = max|w_n| / 127, so q is in [-127, 127] (symmetric, no zero
point), and the activations stay in floating point:

    y = (x @ q.T) * s + b        x (T, K) float, q (N, K) int8, s (N,), b (N,) or none

The kernel is torch's own `aten._weight_int8pack_mm`, which has CPU, CUDA, MPS and XPU kernels
in the torch we pin; a device whose torch build registers none is refused at load with the
reason. Its CPU kernel is fast in bfloat16 only (float32 activations took 60x longer on a
768 -> 5888 decode batch), so on CPU float32 activations enter it rounded to bfloat16 and the
result comes back in float32.

Why weight-only (bench/int8_linear_bench.py, bench/int8_quality.py; docs/BENCHMARKS.md): the
int8 x int8 kernels (oneDNN's qlinear, fbgemm, torch._int_mm) ran a decode batch's linears up to
1.37x faster than bf16, but quantizing SmolLM2's activations, per batch or per row, dropped its
top-1 agreement with bf16 to 67% or 90%; weights alone keep it near bf16's own noise.

Only nn.Linear layers are quantized. The embedding table, and with it a tied output projection,
stays in the serving dtype (see `quantize_linears`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

INT8_MAX = 127
OP = "aten::_weight_int8pack_mm"
# torch device type -> the dispatch key whose kernel runs there
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xpu": "XPU"}


def quantize_per_channel(
    weight: torch.Tensor, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float weight -> (N, K) int8 values and (N,) float32 scales, one per output row.

    scale_dtype: the dtype the kernel will read the scales in. They are rounded to it first and
    the values quantized against the rounded scales, so q * scale is within half a step of w
    (quantizing against float32 scales and rounding them to bf16 after would scale each row by
    up to 2^-9 more). Computed in float32; an all-zero row gets scale 1 (its values are 0)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)  # (N,)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax)).to(scale_dtype).float()
    q = torch.round(w / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def _has_kernel(dispatch_key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(OP, dispatch_key)


def int8_unavailable(device: torch.device, has_kernel: Callable[[str], bool] | None = None) -> str | None:
    """Why int8 weights cannot be served on `device`, or None when they can. has_kernel: whether
    torch registers the op for a dispatch key (default: ask this torch build)."""
    has_kernel = has_kernel or _has_kernel
    key = _DISPATCH_KEYS.get(device.type)
    if key is None:
        return f"--quantization int8 has no kernel on {device.type} devices (it runs on cpu, cuda, mps and xpu)"
    if not has_kernel(key):
        return (
            f"--quantization int8: this torch build ({torch.__version__}) has no {device.type} kernel for "
            f"{OP}, the int8 weight-only matmul; serve without --quantization"
        )
    return None


class Int8Linear(nn.Module):
    """An nn.Linear's forward on int8 weights: y = (x @ qweight.T) * scale + bias."""

    qweight: torch.Tensor  # (N, K) int8
    scale: torch.Tensor  # (N,) in compute_dtype
    bias: torch.Tensor | None  # (N,)

    def __init__(self, linear: nn.Linear, compute_dtype: torch.dtype | None = None) -> None:
        """compute_dtype: the kernel's (default: the weight's, bf16 for float32 on CPU)."""
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        dtype = linear.weight.dtype
        # the dtype the kernel runs in: see the module's docstring for float32 on CPU
        on_cpu = linear.weight.device.type == "cpu"
        self.compute_dtype = compute_dtype or (torch.bfloat16 if on_cpu and dtype == torch.float32 else dtype)
        qweight, scale = quantize_per_channel(linear.weight, self.compute_dtype)
        # Buffers, not parameters: nothing trains them, and model.to(device) still moves them.
        self.register_buffer("qweight", qweight.to(linear.weight.device))
        self.register_buffer("scale", scale.to(linear.weight.device, self.compute_dtype))  # as the kernel's x
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias)

    def dequantized_weight(self) -> torch.Tensor:
        """The float weight this layer computes with, (N, K) float32: qweight * scale."""
        return self.qweight.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(self.compute_dtype)  # (T, K): the kernel takes 2-D
        y = torch._weight_int8pack_mm(rows.contiguous(), self.qweight, self.scale).to(x.dtype)  # (T, N)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def quantize_linears(model: nn.Module, compute_dtype: torch.dtype | None = None) -> int:
    """Swap every nn.Linear of a loaded model for an Int8Linear; return how many.

    An nn.Linear only: the embedding table is an nn.Embedding and is not touched, and a tied
    output projection reads it (the model's compute_logits), so the logits are computed in the
    serving dtype. An untied lm_head is an nn.Linear and is quantized with the rest.
    compute_dtype: as Int8Linear's (tests pass float32 to check the arithmetic exactly)."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child, compute_dtype))
    return len(targets)
