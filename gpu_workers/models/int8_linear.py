"""Linear layers with int8 weights and one float scale per output channel (`--quantization int8`).

The scheme is vLLM's tpu_int8 and torchao's Int8WeightOnlyConfig: each weight row w_n is kept
as q_n = round(w_n / s_n) with s_n = max|w_n| / 127, so q is in [-127, 127] (symmetric, no zero
point), and the activations keep (about) their floating-point precision:

    y = (x @ q.T) * s + b        x (T, K) float, q (N, K) int8, s (N,), b (N,) or none

Two kernels compute it (`Int8Linear.kernel`):

- "onednn", on x86 CPUs with VNNI: oneDNN's int8 GEMM (u8 x s8 -> s32, the op inductor lowers
  x86 int8 linears to, `onednn.qlinear_pointwise`) on the weight packed once. Its activations
  must be int8 too, and one int8 level per activation is what costs quality (bench/int8_quality.py:
  67-90 % agreement with bf16 on SmolLM2), so each row x_t is split in two int8 parts, high and
  low (`split_rows`):

      x_t = a_t * (hi_t + lo_t / 254) + e_t,   a_t = max|x_t| / 127,   |e_t| <= a_t / 508

  and both parts go through the one GEMM as 2T rows. The activations so keep about 16 bits per
  row (bf16 keeps 8 of mantissa), the result is the weight-only one, and at a decode batch's
  32 rows the 64-row int8 GEMM runs as fast as bf16's (bench/int8_linear_bench.py).
- "aten": torch's own `aten._weight_int8pack_mm` (float activations, int8 weights), with CPU,
  CUDA, MPS and XPU kernels in the torch we pin; a device whose torch build registers none is
  refused at load with the reason. Its CPU kernel runs bf16 activations through fp32 FMAs at
  about half bf16's speed, and float32 ones 60x slower, so on CPU float32 activations enter it
  rounded to bfloat16. It serves where oneDNN's int8 GEMM does not (GPUs, CPUs without VNNI,
  where u8 x s8 products can saturate).

At up to small_m_linear.MAX_ROWS_INT8 rows (a decode step of a few sequences) a layer on the "onednn"
kernel, with bf16 activations, runs models/small_m_linear.py's int8 kernel instead where it builds
(avx512bf16 CPUs): the int8 weight widened to bf16 in registers, per-channel scales, on a
second copy of the int8 weight in its layout (docs/BENCHMARKS.md, Session 14).

Only nn.Linear layers are quantized, and not all of them (`quantize_linears`' keep, which a model
class gives as its INT8_KEEP names): the embedding table (and with it a tied output projection),
the attention's fused q|k|v projection and the MLP's down projection stay in the serving dtype, as llama.cpp's k-quant mixes give
attn_qkv / attn_v and ffn_down more bits than the rest, by the same data-free rule. A down
projection reads SiLU(gate) * up, the block's most heavy-tailed activation, whose few large
channels write the residual stream's "massive activations" (Sun et al. 2024; the "super
weights" of Yu et al. 2024 sit in down_proj); q|k errors pass through softmax's exponential.
Measured on SmolLM2 (bench/int8_quality.py, 64 x 128, top-1 == the bf16 greedy token, bf16
itself 98.2 %): every Linear int8 96.6 %; one kind int8, the rest bf16: q|k|v 97.5 %, down
97.5 %, gate|up 97.9 %, o 98.0 %; all but down 97.1 %; all but down and q|k|v (served) 97.6 %.
Kept in bf16: 41 % of SmolLM2's Linear weights (43 M of 106 M), so its Linear weights take 70 %
of bf16's bytes instead of 50 %; on a VNNI CPU the kept layers run oneDNN's bf16 kernel at the
same speed as the int8 ones.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.models import small_m_linear

log = logging.getLogger("omni.worker.int8_linear")

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


# The row count oneDNN tunes its packed layout for: a decode batch's 32 rows, split in two.
ONEDNN_BATCH_HINT = 64
_ZERO_POINT = 128  # the split parts enter the u8 x s8 GEMM as q + 128
LOW_STEPS = 2 * INT8_MAX  # the low part's steps per high step
KERNELS = ("onednn", "aten")
# Layers by handle, for the op below: a packed oneDNN weight has no fake-tensor form, so a graph
# compiled by torch.compile calls the op with the handle (as models/packed_linear.py does).
_LAYERS: weakref.WeakValueDictionary[int, Int8Linear] = weakref.WeakValueDictionary()
_handles = itertools.count()


def onednn_available() -> bool:
    """oneDNN's int8 linear ops are in this torch build and the CPU has VNNI (without it u8 x s8
    pairs are summed in saturating int16, which the split's full-range bytes would overflow)."""
    onednn = torch.ops.onednn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(onednn, "qlinear_prepack")
        and hasattr(onednn, "qlinear_pointwise")
        and torch.cpu._is_vnni_supported()
    )


def split_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, K) float -> (2T, K) uint8 (each row's high part, then each row's low part, both + 128)
    and (T, 1) float32 high scales a: x[t] == a[t] * ((q[t] - 128) + (q[T + t] - 128) / 254) to
    within a[t] / 508 (a row's max|x| / 64516)."""
    xf = x.float()
    amax = xf.abs().amax(dim=1, keepdim=True)  # (T, 1)
    scale = torch.where(amax > 0, amax / INT8_MAX, 1.0)
    steps = xf / scale  # in [-127, 127]
    high = torch.round(steps)
    # steps - high is exact and within 1/2: in 1/254ths it is within 127
    low = torch.round((steps - high) * LOW_STEPS)
    q = torch.cat([high, low]).add_(_ZERO_POINT).to(torch.uint8)
    return q, scale


@torch.library.custom_op("omni::int8_linear", mutates_args=())
def onednn_int8_mm(
    rows: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, handle: torch.Tensor, out_features: int
) -> torch.Tensor:
    """rows (T, K) float and their split (q, scale = split_rows(rows)) -> (T, N) float32
    rows @ int8_weight().T * weight scale, through the layer registered as `handle` (a
    one-element tensor, so that every layer shares one compiled graph). At up to
    small_m_linear.MAX_ROWS_INT8 rows the small-M kernel reads `rows` and the split goes unused."""
    return _LAYERS[int(handle)].onednn_rows(rows, q, scale)


@onednn_int8_mm.register_fake
def _onednn_int8_mm_shape(
    rows: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, handle: torch.Tensor, out_features: int
) -> torch.Tensor:
    return rows.new_empty((rows.shape[0], out_features), dtype=torch.float32)


class Int8Linear(nn.Module):
    """An nn.Linear's forward on int8 weights: y = (x @ int8_weight().T) * scale + bias."""

    scale: torch.Tensor  # (N,): float32 for oneDNN, compute_dtype for aten's kernel
    qweight: torch.Tensor  # (N, K) int8, aten's kernel only
    bias: torch.Tensor | None  # (N,)
    small: torch.Tensor | None  # the int8 values in small_m_linear's layout ("onednn" kernel only)

    def __init__(self, linear: nn.Linear, compute_dtype: torch.dtype | None = None, kernel: str | None = None) -> None:
        """compute_dtype: the "aten" kernel's (default: the weight's, bf16 for float32 on CPU).
        kernel: "onednn" or "aten" (default: onednn on a CPU that has it, see the module's doc)."""
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        dtype = linear.weight.dtype
        on_cpu = linear.weight.device.type == "cpu"
        if kernel is None:
            kernel = "onednn" if on_cpu and compute_dtype is None and onednn_available() else "aten"
        if kernel not in KERNELS or (kernel == "onednn" and not on_cpu):
            raise ValueError(
                f"int8 kernel {kernel!r} on {linear.weight.device.type} (known: {', '.join(KERNELS)}; onednn on cpu)"
            )
        self.kernel = kernel
        self.small = None
        # the dtype the aten kernel runs in: see the module's docstring for float32 on CPU
        self.compute_dtype = compute_dtype or (torch.bfloat16 if on_cpu and dtype == torch.float32 else dtype)
        # the scales as the kernel reads them: float32 for oneDNN, compute_dtype for aten's (its x's)
        scale_dtype = torch.float32 if kernel == "onednn" else self.compute_dtype
        qweight, scale = quantize_per_channel(linear.weight, scale_dtype)
        # Buffers, not parameters: nothing trains them, and model.to(device) still moves them.
        self.register_buffer("scale", scale.to(linear.weight.device, scale_dtype))
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias)
        if kernel == "onednn":
            # the int8 values live in oneDNN's blocked layout only (int8_weight() reads them back)
            self.packed = torch.ops.onednn.qlinear_prepack(qweight, [ONEDNN_BATCH_HINT, self.in_features])
            self.zeros = torch.zeros(self.out_features, dtype=torch.int32)  # the weight's zero points
            # the small-M kernels' copy (bf16 activations, see small_m_linear.py), where they run int8
            small = small_m_linear.load() and small_m_linear.isa() == "avx512bf16"
            self.small = small_m_linear.pack(qweight) if small else None
            self.one = torch.tensor(1.0)  # the activations' scale: applied per row after the GEMM
            self.zero_point = torch.tensor(_ZERO_POINT, dtype=torch.int32)
            handle = next(_handles)
            self.register_buffer("handle", torch.tensor(handle), persistent=False)
            _LAYERS[handle] = self
        else:
            self.register_buffer("qweight", qweight.to(linear.weight.device))

    def onednn_mm(self, q: torch.Tensor) -> torch.Tensor:
        """(R, K) uint8, zero point 128 -> (R, N) float32 (q - 128) @ int8_weight().T * scale."""
        return torch.ops.onednn.qlinear_pointwise.tensor(  # type: ignore[no-any-return]
            q, self.one, self.zero_point, self.packed, self.scale, self.zeros, None, 1.0, 0, torch.float32,
            "none", [], "",
        )  # fmt: skip

    def _small_m(self, rows: torch.Tensor) -> bool:
        # bf16 rows only: the kernel rounds activations to bf16, which for float32 ones would lose
        # the split's ~16 bits (tests/gpu_workers/models/test_int8_linear.py's bound)
        return self.small is not None and rows.dtype == torch.bfloat16 and rows.shape[0] <= small_m_linear.MAX_ROWS_INT8

    def onednn_rows(self, rows: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """(T, K) float rows, and their split -> (T, N) float32 rows @ int8_weight().T * self.scale:
        the small-M kernel at up to MAX_ROWS_INT8 rows where it runs, the split GEMM otherwise."""
        t = rows.shape[0]
        if self.small is not None and self._small_m(rows):
            return small_m_linear.linear(rows, self.small, self.out_features, self.scale, out_dtype=torch.float32)
        acc = self.onednn_mm(q)  # (2T, N)
        return torch.add(acc[:t], acc[t:], alpha=1 / LOW_STEPS).mul_(scale)

    def small_m_form(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """(packed, scale, bias) as small_m_linear's fused ops take a linear (bf16 activations),
        where they serve it."""
        if self.small is None:
            return None
        return self.small, self.scale, None if self.bias is None else self.bias.float().contiguous()

    def int8_weight(self) -> torch.Tensor:
        """(N, K) int8: the weight's values (read back from oneDNN's layout there)."""
        if self.kernel == "onednn":
            return self.packed.to_dense().t()  # type: ignore[no-any-return]
        return self.qweight

    def dequantized_weight(self) -> torch.Tensor:
        """The float weight this layer computes with, (N, K) float32: int8_weight() * scale."""
        return self.int8_weight().float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # (T, K): the kernels take 2-D
        if self.kernel == "onednn" and torch.compiler.is_compiling():
            q, scale = split_rows(rows)  # (2T, K), (T, 1): fused by inductor, unused at small M
            y = onednn_int8_mm(rows, q, scale, self.handle, self.out_features).to(x.dtype)  # (T, N)
        elif self.kernel == "onednn":
            q, scale = (rows, rows) if self._small_m(rows) else split_rows(rows)  # the small-M kernel reads rows
            y = self.onednn_rows(rows, q, scale).to(x.dtype)  # (T, N)
        else:
            rows = rows.to(self.compute_dtype).contiguous()
            y = torch._weight_int8pack_mm(rows, self.qweight, self.scale).to(x.dtype)  # (T, N)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel, {self.kernel}"


def quantize_linears(
    model: nn.Module, compute_dtype: torch.dtype | None = None, kernel: str | None = None, *, keep: tuple[str, ...]
) -> int:
    """Swap every nn.Linear of a loaded model for an Int8Linear, except those named in `keep`
    (the last part of the module's name); return how many were swapped.

    An nn.Linear only: the embedding table is an nn.Embedding and is not touched, and a tied
    output projection reads it (the model's compute_logits), so the logits are computed in the
    serving dtype. An untied lm_head is an nn.Linear and is quantized with the rest.
    compute_dtype, kernel: as Int8Linear's (tests pass float32 and "aten" to check the arithmetic
    exactly)."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and name not in keep
    ]
    if targets and kernel is None and compute_dtype is None and _onednn_disagrees(targets[0][2]):
        kernel = "aten"
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child, compute_dtype, kernel))
    return len(targets)


def _onednn_disagrees(linear: nn.Linear) -> bool:
    """Whether the default kernel is oneDNN and, on one layer, it strays from a float linear on
    the same int8 weights by more than the split and a bf16 output can (a broken build): then
    aten's kernel serves, as models/packed_linear.py falls back for its op."""
    layer = Int8Linear(linear)
    if layer.kernel != "onednn":
        return False
    x = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0)).to(linear.weight.dtype)
    with torch.inference_mode():
        got = layer(x).float()
        want = F.linear(x.float(), layer.dequantized_weight(), None if linear.bias is None else linear.bias.float())
    if torch.allclose(got, want, rtol=2**-6, atol=2**-6 * float(want.abs().max())):
        return False
    log.warning("oneDNN's int8 linear disagrees with a float linear on its weights; using aten's int8 kernel")
    return True
