"""flash-attn varlen attention reading K/V straight from the paged cache (CUDA only).

The package is imported only when this backend is constructed, so CPU machines never load
it. flash-attn 2's paged path (block_table) needs block_size to be a multiple of 256.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gpu_workers.attention.backend import (
    AttentionBackend,
    KVCache,
    SequenceChunk,
    slots_tensor,
    write_kv,
)

_PAGE_MULTIPLE = 256


@dataclass(slots=True)
class FlashAttnMetadata:
    slots: torch.Tensor | None  # (T,) int64 cache slot of each packed row; None: stateless
    cu_seqlens_q: torch.Tensor  # (B + 1,) int32: chunk b owns rows [cu_q[b], cu_q[b + 1])
    cu_seqlens_k: torch.Tensor  # (B + 1,) int32: cumulative context lengths
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor  # (B, max_blocks) int32, padded with block 0 (never read)
    all_fresh: bool  # every chunk starts at position 0 (the stateless path may be used)


class FlashAttnBackend(AttentionBackend):
    name = "flash_attn"

    def __init__(self, block_size: int, device: torch.device) -> None:
        super().__init__(block_size, device)
        if block_size % _PAGE_MULTIPLE:
            raise ValueError(f"flash_attn needs block_size to be a multiple of {_PAGE_MULTIPLE}, got {block_size}")
        from flash_attn import flash_attn_varlen_func

        self._varlen = flash_attn_varlen_func

    @classmethod
    def supports(cls, block_size: int, device: torch.device, dtype: torch.dtype) -> bool:
        if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            return False
        if block_size % _PAGE_MULTIPLE:
            return False
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            return False
        return True

    def build_metadata(self, chunks: list[SequenceChunk]) -> FlashAttnMetadata:
        bs, dev = self.block_size, self.device
        cu_q, cu_k, table = [0], [0], []
        for c in chunks:
            if c.query_start != cu_q[-1]:
                raise ValueError("chunks must be contiguous and sorted by query_start")
            cu_q.append(cu_q[-1] + c.num_query_tokens)
            cu_k.append(cu_k[-1] + c.context_len)
            table.append(c.block_ids[: -(-c.context_len // bs)])
        max_blocks = max(len(t) for t in table)
        table = [t + [0] * (max_blocks - len(t)) for t in table]
        return FlashAttnMetadata(
            slots=slots_tensor(chunks, bs, dev),
            cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=dev),
            cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32, device=dev),
            max_seqlen_q=max(c.num_query_tokens for c in chunks),
            max_seqlen_k=max(c.context_len for c in chunks),
            block_table=torch.tensor(table, dtype=torch.int32, device=dev),
            all_fresh=all(c.num_computed_tokens == 0 for c in chunks),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache | None,
        metadata: FlashAttnMetadata,
        scale: float,
    ) -> torch.Tensor:
        m = metadata
        kwargs: dict[str, Any] = {
            "max_seqlen_q": m.max_seqlen_q, "max_seqlen_k": m.max_seqlen_k, "softmax_scale": scale, "causal": True
        }
        if kv_cache is None:
            if not m.all_fresh:
                raise ValueError("a chunk that continues a sequence needs a KV cache")
            return self._varlen(q, k, v, m.cu_seqlens_q, m.cu_seqlens_q, **kwargs)  # type: ignore[no-any-return]
        write_kv(k, v, kv_cache, m.slots)
        # causal=True aligns the mask bottom-right: query i of a chunk with n queries and
        # context_len keys sees keys [0, context_len - n + i], i.e. its own position and before.
        return self._varlen(  # type: ignore[no-any-return]
            q, kv_cache[0], kv_cache[1], m.cu_seqlens_q, m.cu_seqlens_k, block_table=m.block_table, **kwargs
        )
