"""Attention backends by name; "auto" picks flash-attn where it can run, else torch SDPA."""

from __future__ import annotations

import torch

from gpu_workers.attention.backend import AttentionBackend
from gpu_workers.attention.flash_attn_backend import FlashAttnBackend
from gpu_workers.attention.torch_sdpa import TorchSDPABackend

ATTENTION_BACKENDS: dict[str, type[AttentionBackend]] = {
    TorchSDPABackend.name: TorchSDPABackend,
    FlashAttnBackend.name: FlashAttnBackend,
}


def create_attention_backend(
    name: str, *, block_size: int, device: torch.device, dtype: torch.dtype
) -> AttentionBackend:
    if name == "auto":
        name = FlashAttnBackend.name if FlashAttnBackend.supports(block_size, device, dtype) else TorchSDPABackend.name
    cls = ATTENTION_BACKENDS.get(name)
    if cls is None:
        raise ValueError(f"unknown attention backend {name!r}; known: auto, {', '.join(ATTENTION_BACKENDS)}")
    if not cls.supports(block_size, device, dtype):
        raise ValueError(
            f"attention backend {name!r} cannot run with block_size={block_size} on {device} in {dtype}"
        )
    return cls(block_size, device)
