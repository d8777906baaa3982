"""A library's paged decode kernel inside the compiled decode step (gpu_workers/llm/decode_graph.py).

On CUDA the step's attention over each row's cached tokens is the same library the eager path
uses (the attention backend chosen by --attention-backend or auto), reading the paged cache in
place: nothing is gathered. Inside the graph it is one op, `omni::library_paged_decode`,
registered with torch.library: inductor treats it as opaque (an extern call), and CUDA-graph
trees capture the kernel it launches like any other.

The op takes the rows' queries, one layer's K and V cache, the bucket's block table and each
row's number of cached tokens, and returns the attention over those tokens (B, Hq, D) with its
log-sum-exp (B, Hq), natural log; compiled_decode.py merges the row's own token in by that
log-sum-exp. Which kernel runs is a string argument naming a DecodeKernel registered here.

- FlashInfer (FlashInferDecode): one BatchDecodeWithPagedKVCacheWrapper per bucket, made with
  use_cuda_graph=True and fixed index buffers: for bucket b, indptr (b + 1,), last_page_len (b,)
  and indices (b * max_blocks_per_row,), views of one allocation sized for the largest bucket
  (only one bucket runs at a time). plan() runs on the host before every replay and writes the
  step's pages into those buffers; run() is what the graph captured, reading them.
- flash-attn (FlashAttnDecode, its upstream or vLLM build): flash_attn_with_kvcache with
  block_table and cache_seqlens, which are graph inputs already; nothing to plan.
- "reference": plain torch over a copy of the context, the CPU's implementation of the op, so
  the compiled graph with the op in it runs (and is checked against eager) without a GPU.

FlashInfer's kernels report the log-sum-exp in base 2 (state.cuh: m + log2(d), with the scale
multiplied by log2(e)); flash-attn's is the natural log. The op returns the natural log.
A row with no cached token (a bucket's padding row) is given one, from its table's first block
(the scratch block): the libraries take at least one, and the row's output is discarded.
"""

from __future__ import annotations

import importlib
import itertools
import math
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from gpu_workers.attention.backend import HeadShape

_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace ("Must be initialized to 0")


class DecodeKernel(ABC):
    """One library's paged decode over cached tokens, as the op runs it."""

    name: ClassVar[str]

    @abstractmethod
    def attend(
        self,
        q: torch.Tensor,  # (B, Hq, D)
        k_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D)
        v_cache: torch.Tensor,
        block_table: torch.Tensor,  # (B, M) int64
        num_cached: torch.Tensor,  # (B,) int64
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(out (B, Hq, D) in q's dtype, lse (B, Hq) float32, natural log)."""

    def plan(self, rows: int, tables: Sequence[Sequence[int]], num_cached: Sequence[int]) -> None:
        """On the host, before the graph of bucket `rows` runs: whatever the kernel reads that is
        not a graph input. tables: each row's blocks (at least ceil(num_cached / block_size))."""

    def describe(self) -> str:
        return self.name


# key -> kernel, for the op to find the one a graph names. Weak: a kernel lives as long as the
# DecodeGraph that made it (a worker has one; a test process several).
_KERNELS: weakref.WeakValueDictionary[str, DecodeKernel] = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def register(kernel: DecodeKernel) -> str:
    """The key a graph passes to the op to run `kernel`."""
    key = f"{kernel.name}#{next(_KEYS)}"
    _KERNELS[key] = kernel
    return key


@torch.library.custom_op("omni::library_paged_decode", mutates_args=())
def library_paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    num_cached: torch.Tensor,
    scale: float,
    kernel: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (B, Hq, D) over each row's first num_cached tokens in the paged cache,
    by the registered kernel `kernel`: (out (B, Hq, D), lse (B, Hq) float32, natural log)."""
    return _KERNELS[kernel].attend(q, k_cache, v_cache, block_table, num_cached, scale)


@library_paged_decode.register_fake
def _(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    num_cached: torch.Tensor,
    scale: float,
    kernel: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    b, hq, d = q.shape
    return q.new_empty(b, hq, d), q.new_empty(b, hq, dtype=torch.float32)


def reference_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    num_cached: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's contract in plain torch, over a copy of each row's context; lse -inf (and out 0)
    for a row with nothing cached."""
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    keys = k_cache[block_table].flatten(1, 2).float()  # (B, S, Hkv, D): a copy, fine for a reference
    values = v_cache[block_table].flatten(1, 2).float()
    qg = q.float().view(b, hkv, hq // hkv, d)
    scores = torch.einsum("bhgd,bshd->bhgs", qg, keys) * scale
    visible = torch.arange(keys.shape[1], device=q.device)[None, :] < num_cached[:, None]  # (B, S)
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(scores, -1)  # (B, Hkv, G)
    p = torch.exp(scores - lse.clamp(min=-1e30)[..., None])
    out = torch.einsum("bhgs,bshd->bhgd", p, values)
    return out.reshape(b, hq, d).to(q.dtype), lse.reshape(b, hq)


class ReferenceDecode(DecodeKernel):
    """The op on the CPU: reference_attention (tests run compiled graphs with the op through it)."""

    name = "reference"

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        num_cached: torch.Tensor,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return reference_attention(q, k_cache, v_cache, block_table, num_cached, scale)


class FlashInferDecode(DecodeKernel):
    """FlashInfer 0.7.4's BatchDecodeWithPagedKVCacheWrapper, one per bucket, in CUDA-graph mode.

    Tensor cores (use_tensor_cores=True) with backend "fa2": the wrapper then runs FlashInfer's
    FA2 paged prefill kernel, the one the eager FlashInfer backend runs for short chunks, so one
    JIT build serves both; "fa2" pinned, as "auto" may take other routes under CUDA graphs on
    some GPUs (cudnn, XQA) that would need their own builds.
    """

    name = "flashinfer"

    def __init__(
        self,
        buckets: Sequence[int],
        max_blocks_per_row: int,
        heads: HeadShape,
        block_size: int,
        dtype: torch.dtype,
        scale: float,
        device: torch.device,
        module: Any = None,  # flashinfer; default: imported here
    ) -> None:
        if module is None:
            module = importlib.import_module("flashinfer")
        self.heads, self.block_size, self.dtype, self.scale = heads, block_size, dtype, scale
        self.max_blocks_per_row = max_blocks_per_row
        largest = max(buckets)
        self.workspace = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        # the graph-safe index buffers: fixed addresses, the largest bucket's size; bucket b's
        # wrapper is given their first b + 1, b and b * max_blocks_per_row entries
        self.indptr = torch.zeros(largest + 1, dtype=torch.int32, device=device)
        self.indices = torch.zeros(largest * max_blocks_per_row, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(largest, dtype=torch.int32, device=device)
        self.wrappers = {
            b: module.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.indptr[: b + 1],
                paged_kv_indices_buffer=self.indices[: b * max_blocks_per_row],
                paged_kv_last_page_len_buffer=self.last_page_len[:b],
                backend="fa2",
            )
            for b in buckets
        }

    def pages(self, tables: Sequence[Sequence[int]], num_cached: Sequence[int]) -> tuple[np.ndarray, ...]:
        """FlashInfer's CSR page table of the rows: indptr (B + 1,), indices, last_page_len (B,),
        int32. A row with n cached tokens has ceil(n / block_size) pages (at least 1), the last
        holding n - (pages - 1) * block_size of them (1 when n is 0)."""
        bs = self.block_size
        counts = [max(1, -(-n // bs)) for n in num_cached]
        if max(counts) > self.max_blocks_per_row:
            raise ValueError(f"a decode row reads {max(counts)} blocks; the buffers hold {self.max_blocks_per_row}")
        indptr = np.zeros(len(counts) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        indices = np.fromiter(
            (t[i] for t, c in zip(tables, counts) for i in range(c)), dtype=np.int32, count=int(indptr[-1])
        )
        last = np.array([max(1, n - (c - 1) * bs) for n, c in zip(num_cached, counts)], dtype=np.int32)
        return indptr, indices, last

    def plan(self, rows: int, tables: Sequence[Sequence[int]], num_cached: Sequence[int]) -> None:
        indptr, indices, last = self.pages(tables, num_cached)
        h = self.heads
        # host tensors: plan copies them into the wrapper's buffers (the graph's) and plans on the CPU
        self.wrappers[rows].plan(
            torch.from_numpy(indptr), torch.from_numpy(indices), torch.from_numpy(last),
            h.num_heads, h.num_kv_heads, h.head_dim, self.block_size,
            q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.scale,
        )  # fmt: skip

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        num_cached: torch.Tensor,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse2 = self.wrappers[q.shape[0]].run(q.contiguous(), (k_cache, v_cache), return_lse=True)
        return out, lse2.float() * math.log(2.0)

    def describe(self) -> str:
        return (
            f"flashinfer (BatchDecodeWithPagedKVCacheWrapper, CUDA-graph mode, fa2; index buffers "
            f"for buckets {', '.join(map(str, self.wrappers))} x {self.max_blocks_per_row} blocks a row)"
        )


class FlashAttnDecode(DecodeKernel):
    """flash-attn's flash_attn_with_kvcache reading the cache through block_table (upstream's
    build; vLLM's has no such function: VllmFlashAttnDecode). Its lse is (B, Hq, 1) for one
    query a row."""

    name = "flash_attn"

    def __init__(self, with_kvcache: Callable[..., Any] | None = None) -> None:
        self._call = with_kvcache or self._import()

    @classmethod
    def _import(cls) -> Callable[..., Any]:
        from flash_attn import flash_attn_with_kvcache

        return flash_attn_with_kvcache  # type: ignore[no-any-return]

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        num_cached: torch.Tensor,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = self._call(
            q.unsqueeze(1), k_cache, v_cache, cache_seqlens=num_cached.clamp(min=1).to(torch.int32),
            block_table=block_table.to(torch.int32), softmax_scale=scale, causal=True, return_softmax_lse=True,
        )  # fmt: skip
        return out.squeeze(1), lse.squeeze(-1).float()


class VllmFlashAttnDecode(DecodeKernel):
    """vLLM's build has no flash_attn_with_kvcache (vllm-project/flash-attention at the recorded
    commit): its flash_attn_varlen_func takes the rows as B sequences of one query each
    (cu_seqlens_q 0..B), seqused_k and block_table, as vLLM's own decode does. Its lse is
    (Hq, B): one column per query row. max_seqlen_k is the graphs' widest table, a constant."""

    name = "vllm_flash_attn"

    def __init__(self, max_seqlen_k: int, varlen: Callable[..., Any] | None = None) -> None:
        self.max_seqlen_k = max_seqlen_k
        self._call = varlen or self._import()

    @classmethod
    def _import(cls) -> Callable[..., Any]:
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        return flash_attn_varlen_func  # type: ignore[no-any-return]

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        num_cached: torch.Tensor,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = q.shape[0]
        cu_seqlens_q = torch.arange(rows + 1, dtype=torch.int32, device=q.device)
        out, lse = self._call(
            q, k_cache, v_cache, max_seqlen_q=1, cu_seqlens_q=cu_seqlens_q, max_seqlen_k=self.max_seqlen_k,
            seqused_k=num_cached.clamp(min=1).to(torch.int32), softmax_scale=scale, causal=True,
            block_table=block_table.to(torch.int32), return_softmax_lse=True,
        )  # fmt: skip
        return out, lse.transpose(0, 1).float()


# the attention backends (attention/registry.py) whose library has a decode kernel the graphs use
CUDA_LIBRARY_KERNELS: tuple[str, ...] = (FlashInferDecode.name, FlashAttnDecode.name, VllmFlashAttnDecode.name)
LIBRARY_KERNELS: tuple[str, ...] = (ReferenceDecode.name, *CUDA_LIBRARY_KERNELS)


def create_decode_kernel(
    name: str,
    *,
    buckets: Sequence[int],
    max_blocks_per_row: int,
    heads: HeadShape,
    kv_cache: torch.Tensor,  # one layer's K cache (num_blocks, block_size, Hkv, D)
    scale: float,
) -> DecodeKernel:
    """The kernel `name` (one of LIBRARY_KERNELS) for graphs of these buckets over this cache."""
    if name == FlashInferDecode.name:
        bs = kv_cache.shape[1]
        return FlashInferDecode(buckets, max_blocks_per_row, heads, bs, kv_cache.dtype, scale, kv_cache.device)
    kinds: dict[str, Callable[[], DecodeKernel]] = {
        ReferenceDecode.name: ReferenceDecode, FlashAttnDecode.name: FlashAttnDecode,
        VllmFlashAttnDecode.name: lambda: VllmFlashAttnDecode(max_blocks_per_row * kv_cache.shape[1]),
    }  # fmt: skip
    if name not in kinds:
        raise ValueError(f"unknown library decode kernel {name!r}; known: {', '.join(LIBRARY_KERNELS)}")
    return kinds[name]()
