"""FlashInfer's paged prefill kernel over the paged cache (CUDA only), at any block size.

FlashInfer's BatchPrefillWithPagedKVCacheWrapper takes a step's packed rows, prefill chunks,
prefix-cache hits and decodes together, in one call per layer, reading K and V in place from
the cache in its "NHD" layout, which is ours: (num_blocks, block_size, Hkv, D) each. Its plan
(work partitioning, and the page tables' copy to the GPU) runs once per step, at the first
layer, for every layer; the page tables are paged_varlen.py's, in FlashInfer's CSR form.

The package (flashinfer-python) is imported only when the backend is constructed or asked
whether it can be. Kernels come precompiled from flashinfer-jit-cache / flashinfer-cubin, or
are compiled at first use with nvcc: warm_up runs one call so that happens before the worker
reports ready, and a failure is a start-up error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gpu_workers.attention.backend import (
    HeadShape,
    KVCache,
    SequenceChunk,
    write_kv,
)
from gpu_workers.attention.flash_attn_backend import PagedKernelBackend, contract_problems, raise_problems
from gpu_workers.attention.paged_varlen import PagedVarlenMetadata, build_paged_varlen, flashinfer_pages
from gpu_workers.attention.torch_sdpa import PrefillChunk, TorchSDPABackend

# the head sizes FlashInfer's prefill kernels are built for (its precompiled cache and its
# JIT's tested set)
HEAD_DIMS = (64, 128, 256)
_WORKSPACE_BYTES = 128 << 20  # the float workspace FlashInfer's examples allocate


@dataclass(slots=True)
class FlashInferMetadata:
    varlen: PagedVarlenMetadata  # on the CPU: plan() reads the indptrs on the host
    slots: torch.Tensor | None  # (T,) int64 on the device
    kv_indptr: torch.Tensor  # (B + 1,) int32, CPU
    kv_indices: torch.Tensor  # (pages,) int32, CPU
    last_page_len: torch.Tensor  # (B,) int32, CPU
    planned: bool = False  # set by the first layer's forward


class FlashInferBackend(PagedKernelBackend):
    name = "flashinfer"

    @classmethod
    def check_contract(
        cls, block_size: int, device: torch.device, dtype: torch.dtype, heads: HeadShape | None = None
    ) -> None:
        raise_problems(cls.name, contract_problems(block_size, device, dtype, heads, block_multiple=1,
                                                   head_dims=HEAD_DIMS))  # fmt: skip

    @classmethod
    def importable(cls) -> str | None:
        try:
            import flashinfer  # noqa: F401
        except ImportError as e:
            return f"flashinfer-python cannot be imported ({e}); bin/setup gpu installs it"
        return None

    def __init__(self, block_size: int, device: torch.device) -> None:
        super().__init__(block_size, device)
        import flashinfer

        workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrapper: Any = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._planned_for: FlashInferMetadata | None = None

    def build_metadata(self, chunks: list[SequenceChunk]) -> FlashInferMetadata:
        cpu = torch.device("cpu")
        varlen = build_paged_varlen(chunks, self.block_size, cpu)
        indptr, indices, last = flashinfer_pages(varlen, self.block_size)
        slots = None if varlen.slots is None else varlen.slots.to(self.device)
        return FlashInferMetadata(varlen, slots, indptr, indices, last)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache | None,
        metadata: FlashInferMetadata,
        scale: float,
    ) -> torch.Tensor:
        m = metadata
        if kv_cache is None:
            if not m.varlen.all_fresh:
                raise ValueError("a chunk that continues a sequence needs a KV cache")
            # no cache to page through (stateless forwards only): each chunk causal over its own K/V
            cu = m.varlen.cu_seqlens_q.tolist()
            out = torch.empty_like(q)
            for s, e in zip(cu, cu[1:]):
                out[s:e] = TorchSDPABackend._prefill(q, k, v, None, PrefillChunk(s, e, e - s, None, None), scale)
            return out
        write_kv(k, v, kv_cache, m.slots)
        return self._paged(q, kv_cache, m, scale)

    def _paged(self, q: torch.Tensor, kv_cache: KVCache, m: FlashInferMetadata, scale: float) -> torch.Tensor:
        k_cache = kv_cache[0]
        _, bs, hkv, dim = k_cache.shape
        if not m.planned or self._planned_for is not m:
            # once per step: every layer shares the heads, the scale and the page tables
            self._wrapper.plan(
                m.varlen.cu_seqlens_q, m.kv_indptr, m.kv_indices, m.last_page_len, q.shape[1], hkv, dim, bs,
                causal=True, sm_scale=scale, q_data_type=q.dtype, kv_data_type=k_cache.dtype,
            )  # fmt: skip
            m.planned, self._planned_for = True, m
        return self._wrapper.run(q, (kv_cache[0], kv_cache[1]))  # type: ignore[no-any-return]
