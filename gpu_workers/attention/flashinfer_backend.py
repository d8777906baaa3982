"""FlashInfer's paged prefill kernel over the paged cache (CUDA only), at any block size.

FlashInfer's BatchPrefillWithPagedKVCacheWrapper takes a step's packed rows, prefill chunks,
prefix-cache hits and decodes together, in one call per layer, reading K and V in place from
the cache in its "NHD" layout, which is ours: (num_blocks, block_size, Hkv, D) each. Its plan
(work partitioning, and the page tables' copy to the GPU) runs once per step, at the first
layer, for every layer; the page tables are paged_varlen.py's, in FlashInfer's CSR form.

Which of FlashInfer's kernels: its `auto` plans FA2 for a step whose longest chunk is at most 64
rows and FA3 (sm90 only) otherwise, so a worker would build both, at its first decode and in
its profile run, and an FA3 that fails to build under the machine's nvcc would kill the profile
run (and the restarted worker's, forever). So the wrapper is told its kernel: prepare() tries
FA3 (on sm90), then FA2, each on the short-row and the long-chunk shape, and keeps the first
that runs; every failure is a warning, and when none runs create_attention_backend serves with
torch SDPA. Kernels come from FlashInfer's JIT cache (~/.cache/flashinfer, filled by
`bin/setup gpu`: attention/flashinfer_build.py) or are built with nvcc there and then; the log
says which, with the time.

The package (flashinfer-python) is imported only when the backend is constructed or asked
whether it can be. Every call's arguments are bound to FlashInfer 0.7.4's signatures in the
tests (tests/gpu_workers/attention/library_signatures.json).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
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

log = logging.getLogger(__name__)

# the head sizes FlashInfer's prefill kernels are built for (its precompiled cache and its
# JIT's tested set)
HEAD_DIMS = (64, 128, 256)
_WORKSPACE_BYTES = 128 << 20  # the float workspace FlashInfer's examples allocate


def kernels_for(device: torch.device) -> tuple[str, ...]:
    """FlashInfer's prefill kernels to try, best first: FA3 is built for sm90a alone (0.7.4's
    utils.is_sm90a_supported: compute capability 9.x), FA2 runs everywhere."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9:
        return ("fa3", "fa2")
    return ("fa2",)


def jit_modules() -> frozenset[str]:
    """The kernel modules FlashInfer has built into its JIT cache: <FLASHINFER_JIT_DIR>/<name>/<name>.so
    (0.7.4's jit/core.py JitSpecNvcc.jit_library_path). Empty where that cannot be read."""
    try:
        from flashinfer.jit import env

        root = Path(env.FLASHINFER_JIT_DIR)
    except Exception:  # noqa: BLE001 - an absent or older FlashInfer: nothing to compare
        return frozenset()
    return frozenset(p.parent.name for p in root.glob("*/*.so") if p.stem == p.parent.name)


class KernelUnavailable(RuntimeError):
    """None of a backend's kernels ran here; the message has each one's failure."""


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
        except Exception as e:  # noqa: BLE001 - not only ImportError: a CUDA library's OSError, a RuntimeError at import
            return f"flashinfer-python cannot be imported ({type(e).__name__}: {e}); bin/setup gpu installs it"
        return None

    def __init__(self, block_size: int, device: torch.device, kernels: tuple[str, ...] | None = None) -> None:
        super().__init__(block_size, device)
        import flashinfer

        self._flashinfer = flashinfer
        self._workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.kernels = kernels_for(device) if kernels is None else kernels  # to try, best first
        self.kernel = self.kernels[0]  # prepare() settles it
        self._wrapper: Any = self._new_wrapper(self.kernel)
        self._planned_for: FlashInferMetadata | None = None

    def _new_wrapper(self, kernel: str) -> Any:
        # the workspace is shared: one wrapper plans and runs at a time
        return self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, kv_layout="NHD", backend=kernel)

    def prepare(self, dtype: torch.dtype, heads: HeadShape) -> None:
        """Each kernel in turn, best first, until one builds (or loads) and runs both shapes;
        raises KernelUnavailable when none does."""
        failures = []
        for kernel in self.kernels:
            before = jit_modules()
            log.info("FlashInfer %s: loading its kernels for head_dim %d, %s (built first where not cached)",
                     kernel, heads.head_dim, dtype)  # fmt: skip
            started = time.perf_counter()
            try:
                self._wrapper, self.kernel, self._planned_for = self._new_wrapper(kernel), kernel, None
                self._exercise(dtype, heads)
            except Exception as e:  # noqa: BLE001 - nvcc's failure, a missing symbol, an API mismatch: try the next
                failures.append(f"{kernel}: {type(e).__name__}: {e}")
                log.warning("FlashInfer %s is unavailable here (%s: %s); trying the next kernel", kernel, type(e).__name__, e)
                continue
            seconds = time.perf_counter() - started
            built = sorted(jit_modules() - before)
            if built:
                log.warning("FlashInfer %s: built %d kernel module(s) at start in %.1f s (%s); `bin/setup gpu` builds "
                            "them before the server starts", kernel, len(built), seconds, ", ".join(built))  # fmt: skip
            else:
                log.info("FlashInfer %s: kernels ready in %.2f s", kernel, seconds)
            return
        raise KernelUnavailable(f"no FlashInfer kernel runs here: {'; '.join(failures)}")

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
                qo_indptr=m.varlen.cu_seqlens_q, paged_kv_indptr=m.kv_indptr, paged_kv_indices=m.kv_indices,
                paged_kv_last_page_len=m.last_page_len, num_qo_heads=q.shape[1], num_kv_heads=hkv, head_dim_qk=dim,
                page_size=bs, causal=True, sm_scale=scale, q_data_type=q.dtype, kv_data_type=k_cache.dtype,
            )  # fmt: skip
            m.planned, self._planned_for = True, m
        return self._wrapper.run(q, paged_kv_cache=(kv_cache[0], kv_cache[1]))  # type: ignore[no-any-return]
