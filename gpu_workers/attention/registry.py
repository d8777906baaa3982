"""Attention backends by name, and "auto".

auto, on CUDA: the first paged kernel that is importable and takes this cache, in the order
vllm_flash_attn (any block size that is a multiple of 16), flash_attn (blocks of 256 and up),
flashinfer (any block size; the one `bin/setup gpu` installs); torch SDPA when none does.
Elsewhere auto is torch SDPA. A backend named explicitly whose contract the cache breaks, or
whose package is missing, is a start-up error that says which. A package that fails to import
in any way (an OSError from a CUDA library as much as an ImportError) counts as missing.

A paged kernel chosen (by name or by auto) then runs once on a scratch cache of the model's
head shape before the model loads (PagedKernelBackend.prepare: FlashInfer tries FA3, then
FA2). When it cannot build or run here, the worker serves with torch SDPA and says so in a
warning: a kernel's failure never stops the worker from starting, so the supervisor never
restarts it for that, again and again.

flex_paged (decodes read K/V in place through a compiled flex_attention kernel, on the CPU) is
chosen by name for now: it is faster in fp32 (attention 72.6 -> 40.3 ms a decode step at
32 x 200) and even in bf16, and it compiles for 6-18 s in each worker at start, a cost that
issue 23's compiled decode step is to bound and cache for every kernel at once; until then the
default starts at once (and so does every test server)."""

from __future__ import annotations

import logging

import torch

from gpu_workers.attention.backend import AttentionBackend, HeadShape
from gpu_workers.attention.flash_attn_backend import FlashAttnBackend, PagedKernelBackend, VllmFlashAttnBackend
from gpu_workers.attention.flashinfer_backend import FlashInferBackend
from gpu_workers.attention.flex_paged import FlexPagedBackend
from gpu_workers.attention.torch_sdpa import TorchSDPABackend

log = logging.getLogger(__name__)

ATTENTION_BACKENDS: dict[str, type[AttentionBackend]] = {
    TorchSDPABackend.name: TorchSDPABackend,
    VllmFlashAttnBackend.name: VllmFlashAttnBackend,
    FlashAttnBackend.name: FlashAttnBackend,
    FlashInferBackend.name: FlashInferBackend,
    FlexPagedBackend.name: FlexPagedBackend,
}
CUDA_AUTO_ORDER: tuple[type[AttentionBackend], ...] = (VllmFlashAttnBackend, FlashAttnBackend, FlashInferBackend)


def auto_backend_name(block_size: int, device: torch.device, dtype: torch.dtype, heads: HeadShape | None) -> str:
    if device.type == "cuda":
        for cls in CUDA_AUTO_ORDER:
            if cls.supports(block_size, device, dtype, heads):
                return cls.name
    return TorchSDPABackend.name


def create_attention_backend(
    name: str, *, block_size: int, device: torch.device, dtype: torch.dtype, heads: HeadShape | None = None
) -> AttentionBackend:
    """heads: the model's head shape, when known (the runner reads it before choosing)."""
    if name == "auto":
        name = auto_backend_name(block_size, device, dtype, heads)
    cls = ATTENTION_BACKENDS.get(name)
    if cls is None:
        raise ValueError(f"unknown attention backend {name!r}; known: auto, {', '.join(ATTENTION_BACKENDS)}")
    cls.check_contract(block_size, device, dtype, heads)
    missing = cls.importable()
    if missing is not None:
        raise ValueError(f"attention backend {name!r} is not available here: {missing}")
    if not issubclass(cls, PagedKernelBackend) or heads is None:
        return cls(block_size, device)
    try:
        backend = cls(block_size, device)
        backend.prepare(dtype, heads)
    except Exception as e:  # noqa: BLE001 - a build (nvcc), a load or a first run that failed: serve, more slowly
        log.warning("attention backend %r cannot run here (%s: %s); serving with %r instead",
                    name, type(e).__name__, e, TorchSDPABackend.name)  # fmt: skip
        return TorchSDPABackend(block_size, device)
    return backend
