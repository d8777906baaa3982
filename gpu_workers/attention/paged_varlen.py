"""The paged varlen contract of the CUDA kernels, built once per step, and a pure-torch
reference of what they compute from it.

flash-attn's varlen function with a block table (upstream, and vLLM's build of it) and
FlashInfer's paged prefill wrapper all take a step's packed rows in one call per layer, reading
K/V where they lie in the paged cache (K, V each (num_blocks, block_size, Hkv, D), the layout
backend.py describes). They are fed from the same per-step metadata:

- cu_seqlens_q (B + 1,) int32: chunk b owns packed rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]);
- seqused_k (B,) int32: chunk b's context length (positions with K/V once this step's are written);
- cu_seqlens_k (B + 1,) int32: their running sums (upstream flash-attn reads these instead);
- block_table (B, max_blocks) int32: chunk b's block ids, padded with block 0 (never read);
- slots (T,) int64: the cache slot each packed row's new K/V is written to;
- max_seqlen_q, max_seqlen_k.

The causal mask is aligned bottom-right: query i of a chunk with n queries and context_len keys
sees keys [0, context_len - n + i], its own position and every earlier one. FlashInfer names
the same pages in CSR form (flashinfer_pages). Everything here is plain torch on the CPU, so
the CPU tests prove what the GPU kernels are fed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpu_workers.attention.backend import SequenceChunk, slots_tensor


@dataclass(slots=True)
class PagedVarlenMetadata:
    num_tokens: int
    slots: torch.Tensor | None  # (T,) int64 cache slot of each packed row; None: stateless
    cu_seqlens_q: torch.Tensor  # (B + 1,) int32
    seqused_k: torch.Tensor  # (B,) int32 context length of each chunk
    cu_seqlens_k: torch.Tensor  # (B + 1,) int32
    block_table: torch.Tensor  # (B, max_blocks) int32, padded with block 0
    max_seqlen_q: int
    max_seqlen_k: int
    all_fresh: bool  # every chunk starts at position 0 (a stateless forward may run)


def build_paged_varlen(chunks: list[SequenceChunk], block_size: int, device: torch.device) -> PagedVarlenMetadata:
    """chunks sorted by query_start, contiguous. The int32 tensors travel in one host-to-device
    copy (views of one buffer)."""
    if not chunks:
        raise ValueError("a step needs at least one chunk")
    cu_q, lens, cu_k, tables = [0], [], [0], []
    for c in chunks:
        if c.query_start != cu_q[-1]:
            raise ValueError("chunks must be contiguous and sorted by query_start")
        cu_q.append(cu_q[-1] + c.num_query_tokens)
        lens.append(c.context_len)
        cu_k.append(cu_k[-1] + c.context_len)
        needed = -(-c.context_len // block_size)
        if c.block_ids and len(c.block_ids) < needed:
            raise ValueError(f"a chunk of context {c.context_len} has {len(c.block_ids)} blocks of {block_size}")
        tables.append(c.block_ids[:needed])
    b = len(chunks)
    width = max(1, max(len(t) for t in tables))
    flat = cu_q + lens + cu_k
    for t in tables:
        flat += t + [0] * (width - len(t))
    packed = torch.tensor(flat, dtype=torch.int32).to(device)
    return PagedVarlenMetadata(
        num_tokens=cu_q[-1],
        slots=slots_tensor(chunks, block_size, device),
        cu_seqlens_q=packed[: b + 1],
        seqused_k=packed[b + 1 : 2 * b + 1],
        cu_seqlens_k=packed[2 * b + 1 : 3 * b + 2],
        block_table=packed[3 * b + 2 :].view(b, width),
        max_seqlen_q=max(c.num_query_tokens for c in chunks),
        max_seqlen_k=max(lens),
        all_fresh=all(c.num_computed_tokens == 0 for c in chunks),
    )


def flashinfer_pages(m: PagedVarlenMetadata, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same pages as FlashInfer names them: kv_indptr (B + 1,), kv_indices (sum of pages,)
    and last_page_len (B,), int32 on m's device (1 <= last_page_len <= block_size)."""
    lens = m.seqused_k.long()
    pages = (lens + block_size - 1) // block_size  # (B,)
    indptr = torch.cat([pages.new_zeros(1), pages.cumsum(0)]).to(torch.int32)
    used = torch.arange(m.block_table.shape[1], device=lens.device)[None, :] < pages[:, None]  # (B, M)
    indices = m.block_table[used]  # row-major: each chunk's pages in order, chunk after chunk
    last = (lens - (pages - 1) * block_size).to(torch.int32)
    return indptr, indices, last


def paged_varlen_reference(
    q: torch.Tensor,  # (T, Hq, D)
    k_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D), this step's K already written
    v_cache: torch.Tensor,
    m: PagedVarlenMetadata,
    scale: float,
) -> torch.Tensor:
    """What a paged varlen kernel computes from m, one chunk at a time in float32: (T, Hq, D).
    For tests: it reads the cache through block_table and seqused_k alone."""
    _, bs, hkv, dim = k_cache.shape
    hq = q.shape[1]
    out = torch.empty_like(q)
    cu, lens = m.cu_seqlens_q.tolist(), m.seqused_k.tolist()
    for b, ctx in enumerate(lens):
        n = cu[b + 1] - cu[b]
        blocks = m.block_table[b, : -(-ctx // bs)].long()
        k = k_cache[blocks].reshape(-1, hkv, dim)[:ctx].float()  # (ctx, Hkv, D)
        v = v_cache[blocks].reshape(-1, hkv, dim)[:ctx].float()
        qb = q[cu[b] : cu[b + 1]].float().view(n, hkv, hq // hkv, dim)  # (n, Hkv, G, D)
        s = torch.einsum("nhgd,khd->hgnk", qb, k) * scale  # (Hkv, G, n, ctx)
        pos = torch.arange(ctx - n, ctx)  # bottom-right aligned: the queries' positions
        s = s.masked_fill(torch.arange(ctx)[None, :] > pos[:, None], float("-inf"))
        o = torch.einsum("hgnk,khd->nhgd", s.softmax(-1), v)  # (n, Hkv, G, D)
        out[cu[b] : cu[b + 1]] = o.reshape(n, hq, dim).to(q.dtype)
    return out
