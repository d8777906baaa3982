"""Linear layers with int8 weights and one float scale per output channel (`--quantization int8`).

The scheme is vLLM's tpu_int8 and torchao's Int8WeightOnlyConfig: each weight row w_n is kept
as q_n = round(w_n / s_n) with s_n = max|w_n| / 127, so q is in [-127, 127] (symmetric, no zero
point), and the activations stay in the serving dtype:

    y = (x @ q.T) * s + b        x (T, K) float, q (N, K) int8, s (N,), b (N,) or none

The kernel is torch's own `aten._weight_int8pack_mm`, which has CPU, CUDA, MPS and XPU kernels
in the torch we pin; a device whose torch build registers none is refused at load with the
reason. On CPU it beat oneDNN's dynamic int8 linear, fbgemm's and torchao's compiled configs on
a decode batch (bench/int8_linear_bench.py; docs/BENCHMARKS.md), and needs no package.

Only the decoder layers' Linears are quantized. The embedding table, and with it a tied output
projection, stays in the serving dtype (see `quantize_linears`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

INT8_MAX = 127
OP = "aten::_weight_int8pack_mm"
# torch device type -> the dispatch key whose kernel runs there
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xpu": "XPU"}


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float weight -> (N, K) int8 values and (N,) float32 scales, one per output row.

    Computed in float32 whatever the weight's dtype; an all-zero row gets scale 1 (its values
    are 0 either way), so no scale is 0 and nothing divides by it."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)  # (N,)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
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

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        dtype = linear.weight.dtype
        qweight, scale = quantize_per_channel(linear.weight)
        # Buffers, not parameters: nothing trains them, and model.to(device) still moves them.
        self.register_buffer("qweight", qweight.to(linear.weight.device))
        self.register_buffer("scale", scale.to(linear.weight.device, dtype))  # the kernel wants x's dtype
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias)

    def dequantized_weight(self) -> torch.Tensor:
        """The float weight this layer computes with, (N, K) float32: qweight * scale."""
        return self.qweight.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # (T, K): the kernel takes 2-D activations
        y = torch._weight_int8pack_mm(rows.contiguous(), self.qweight, self.scale)  # (T, N)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def quantize_linears(model: nn.Module) -> int:
    """Swap every nn.Linear of a loaded model for an Int8Linear; return how many.

    An nn.Linear only: the embedding table is an nn.Embedding and is not touched, and a tied
    output projection reads it (the model's compute_logits), so the logits are computed in the
    serving dtype. An untied lm_head is an nn.Linear and is quantized with the rest."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child))
    return len(targets)
