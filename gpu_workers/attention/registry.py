"""Attention backends by name. "auto" picks flash-attn where it can run; on CPU flex_paged
(decodes read K/V in place through a compiled flex_attention kernel) where inductor can compile
it; else torch SDPA (which copies the decode batch's padded context: kept for comparison)."""

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
            (c.name for c in (FlashAttnBackend, FlexPagedBackend) if c.supports(block_size, device, dtype)),
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
