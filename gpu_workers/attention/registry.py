"""Attention backends by name. "auto" picks flash-attn where it can run, else torch SDPA.

flex_paged (decodes read K/V in place through a compiled flex_attention kernel) is chosen by
name for now: it is faster in fp32 (attention 72.6 -> 40.3 ms a decode step at 32 x 200) and
even in bf16, and it compiles for 6-18 s in each worker at start, a cost that issue 23's compiled
decode step is to bound and cache for every kernel at once; until then the default starts at
once (and so does every test server)."""

from __future__ import annotations

import torch

from gpu_workers.attention.backend import AttentionBackend
from gpu_workers.attention.flash_attn_backend import FlashAttnBackend
from gpu_workers.attention.flex_paged import FlexPagedBackend
from gpu_workers.attention.torch_sdpa import TorchSDPABackend

ATTENTION_BACKENDS: dict[str, type[AttentionBackend]] = {
    TorchSDPABackend.name: TorchSDPABackend,
    FlashAttnBackend.name: FlashAttnBackend,
    FlexPagedBackend.name: FlexPagedBackend,
}


def create_attention_backend(
    name: str, *, block_size: int, device: torch.device, dtype: torch.dtype
) -> AttentionBackend:
    if name == "auto":
        name = next(
            (c.name for c in (FlashAttnBackend,) if c.supports(block_size, device, dtype)),
            TorchSDPABackend.name,
        )
    cls = ATTENTION_BACKENDS.get(name)
    if cls is None:
        raise ValueError(f"unknown attention backend {name!r}; known: auto, {', '.join(ATTENTION_BACKENDS)}")
    if not cls.supports(block_size, device, dtype):
        raise ValueError(
            f"attention backend {name!r} cannot run with block_size={block_size} on {device} in {dtype}"
        )
    return cls(block_size, device)
