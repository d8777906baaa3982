"""Linear layers on CPU through oneDNN, with each weight reordered once at load time.

torch's F.linear on CPU hands the weight to MKL as it is stored. oneDNN with the weight
reordered into its own blocked layout once runs the small-M matmuls of decode steps much
faster on this kind of CPU (measured on 2 cores, fp32, 32 rows: 768->5888 3.4 ms -> 1.35 ms;
768->1280 0.58 -> 0.31 ms) and is no slower for 512-row prefill chunks. torch.compile's CPU
backend does the same with frozen weights; this does it without compiling.
"""

from __future__ import annotations

import itertools
import logging
import weakref

import torch
from torch import nn

log = logging.getLogger("omni.worker.packed_linear")

# The row count oneDNN tunes the packed layout for; decode batches are of this order.
BATCH_HINT = 32


def _ops_available() -> bool:
    mkldnn = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
    )


# Packed weights by handle, for the op below: a oneDNN-layout tensor cannot be traced by
# torch.compile (it has no fake-tensor form), so a compiled graph calls the op with the handle.
_PACKED: weakref.WeakValueDictionary[int, PackedLinear] = weakref.WeakValueDictionary()
_handles = itertools.count()


@torch.library.custom_op("omni::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, handle: torch.Tensor, out_features: int) -> torch.Tensor:
    """x (..., in) -> (..., out_features) through the packed weight registered as `handle` (a
    one-element tensor, so that every layer's linears share one compiled graph; an int would
    be a constant dynamo specialises on)."""
    m = _PACKED[int(handle)]
    return torch.ops.mkldnn._linear_pointwise(x, m.packed, m.bias, "none", [], "")  # type: ignore[no-any-return]


@packed_linear.register_fake
def _packed_linear_shape(x: torch.Tensor, handle: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear, batch_hint: int = BATCH_HINT) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()
        handle = next(_handles)
        self.register_buffer("handle", torch.tensor(handle), persistent=False)
        _PACKED[handle] = self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return packed_linear(x, self.handle, self.out_features)  # type: ignore[no-any-return]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn"


def pack_linears(model: nn.Module, *, device: torch.device, dtype: torch.dtype) -> int:
    """Swap every nn.Linear of a loaded CPU model for a PackedLinear; return how many.

    A no-op (0) off CPU, for dtypes oneDNN does not pack here, or without the ops. The result
    of the first layer is checked against F.linear so a broken oneDNN build falls back.
    """
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or not _ops_available():
        return 0
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    if not targets:
        return 0
    probe = targets[0][2]
    x = torch.randn(3, probe.in_features, dtype=dtype)
    try:
        packed = PackedLinear(probe)
        got, want = packed(x), probe(x)
    except RuntimeError as exc:  # an op missing or unsupported for this dtype/CPU
        log.info("oneDNN linear unavailable (%s); using torch's", exc)
        return 0
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    if not torch.allclose(got.float(), want.float(), rtol=tol, atol=tol):
        log.warning("oneDNN linear disagrees with F.linear; using torch's")
        return 0
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
    return len(targets)
