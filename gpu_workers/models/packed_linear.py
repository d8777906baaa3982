"""Linear layers on CPU through oneDNN, with each weight reordered once at load time.

torch's F.linear on CPU hands the weight to MKL as it is stored. oneDNN with the weight
reordered into its own blocked layout once runs the small-M matmuls of decode steps much
faster on this kind of CPU (measured on 2 cores, fp32, 32 rows: 768->5888 3.4 ms -> 1.35 ms;
768->1280 0.58 -> 0.31 ms) and is no slower for 512-row prefill chunks. torch.compile's CPU
backend does the same with frozen weights; this does it without compiling.

At up to small_m_linear.MAX_ROWS rows (a decode step of one sequence) a PackedLinear runs the
bandwidth-bound kernels of models/small_m_linear.py instead, on a second copy of the weight in
their layout, where that extension builds and has a path for this CPU: there oneDNN's packed
GEMM trails them on most of SmolLM2's shapes (docs/BENCHMARKS.md, Session 14). The copy
doubles the linear weights' memory; `small_m=False` leaves it out.
"""

from __future__ import annotations

import itertools
import logging
import weakref

import torch
from torch import nn

from gpu_workers.models import small_m_linear

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
    return _PACKED[int(handle)].run(x)


@packed_linear.register_fake
def _packed_linear_shape(x: torch.Tensor, handle: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


class PackedLinear(nn.Module):
    small: torch.Tensor | None  # the weight in small_m_linear's layout, when its kernels serve here
    small_bias: torch.Tensor | None  # (N,) float32, theirs

    def __init__(self, linear: nn.Linear, batch_hint: int = BATCH_HINT, small_m: bool = True) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()
        small_m = small_m and weight.dtype in (torch.bfloat16, torch.float32) and small_m_linear.load()
        self.small = small_m_linear.pack(weight) if small_m else None
        self.small_bias = None if self.small is None or self.bias is None else self.bias.float().contiguous()
        handle = next(_handles)
        self.register_buffer("handle", torch.tensor(handle), persistent=False)
        _PACKED[handle] = self

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) -> (..., out): the small-M kernel at up to small_m_linear.MAX_ROWS rows, oneDNN's above."""
        rows = x.numel() // self.in_features
        if self.small is not None and rows <= small_m_linear.MAX_ROWS and x.dtype == self.small.dtype:
            y = small_m_linear.linear(
                x.reshape(rows, self.in_features), self.small, self.out_features, bias=self.small_bias
            )
            return y.view(*x.shape[:-1], self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")  # type: ignore[no-any-return]

    def small_m_form(self) -> tuple[torch.Tensor, None, torch.Tensor | None] | None:
        """(packed, scale, bias) as small_m_linear's fused ops take a linear, where they serve it."""
        return None if self.small is None else (self.small, None, self.small_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return packed_linear(x, self.handle, self.out_features)  # type: ignore[no-any-return]
        return self.run(x)

    def extra_repr(self) -> str:
        small = (
            f", small-M {small_m_linear.isa()} up to {small_m_linear.MAX_ROWS} rows" if self.small is not None else ""
        )
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn{small}"


def pack_linears(model: nn.Module, *, device: torch.device, dtype: torch.dtype) -> int:
    """Swap every nn.Linear of a loaded CPU model for a PackedLinear; return how many.

    A tied output projection (a module whose lm_head is None and whose embed_tokens is an
    nn.Embedding: compute_logits reads the table) gets a PackedLinear over the table as its
    lm_head, so the logits run the same kernels; the table itself stays for the lookup.

    A no-op (0) off CPU, for dtypes oneDNN does not pack here, or without the ops. The result
    of the first layer is checked against F.linear so a broken oneDNN build falls back, and the
    small-M kernels' result likewise, so a broken build of theirs leaves them out.
    """
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or not _ops_available():
        return 0
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent in list(model.modules()):
        embed = getattr(parent, "embed_tokens", None)
        if getattr(parent, "lm_head", 0) is None and isinstance(embed, nn.Embedding):
            head = nn.Linear(embed.embedding_dim, embed.num_embeddings, bias=False, device="meta")
            head.weight = embed.weight  # shared, not copied: PackedLinear copies it into its layouts
            targets.append((parent, "lm_head", head))
    if not targets:
        return 0
    probe = targets[0][2]
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    small_m = True
    try:
        packed = PackedLinear(probe)
        for rows in (small_m_linear.MAX_ROWS + 3, 1):  # oneDNN's GEMM, then the small-M kernel's
            x = torch.randn(rows, probe.in_features, dtype=dtype)
            got, want = packed(x), probe(x)
            if not torch.allclose(got.float(), want.float(), rtol=tol, atol=tol):
                if packed.small is None or rows > small_m_linear.MAX_ROWS:
                    log.warning("oneDNN linear disagrees with F.linear; using torch's")
                    return 0
                log.warning("the small-M linear kernel disagrees with F.linear; using oneDNN's at every M")
                small_m = False
    except RuntimeError as exc:  # an op missing or unsupported for this dtype/CPU
        log.info("oneDNN linear unavailable (%s); using torch's", exc)
        return 0
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child, small_m=small_m))
    return len(targets)
