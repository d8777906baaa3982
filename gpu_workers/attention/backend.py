"""The attention backend interface and the paged KV cache layout it works on.

Per layer the cache is a pair of tensors K, V shaped (num_blocks, block_size, num_kv_heads,
head_dim). A request's token at position p lives in slot

    block_ids[p // block_size] * block_size + p % block_size

of the flattened (num_blocks * block_size, num_kv_heads, head_dim) view. Each step writes the
new tokens' K/V into their slots first, then every query at position p attends over positions
[0, p] of its own request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

KVCache = tuple[torch.Tensor, torch.Tensor]  # K, V: (num_blocks, block_size, num_kv_heads, head_dim)


@dataclass(frozen=True, slots=True)
class PagedDecodePlan:
    """A decode-only step's attention as native code calls it, every layer alike: the address of
    attention/cpu_paged.c's paged_decode (it writes each row's K/V at its slot, then attends over
    the row's context in place) and the step's tables, read by models/small_m_linear.cpp's
    decode_layers without a Python call per layer."""

    entry: int  # the C function's address
    block_table: torch.Tensor  # (B, W) int64, contiguous
    context_lens: torch.Tensor  # (B,) int64: each row's context, its own token included
    slots: torch.Tensor  # (B,) int64: where each row's K/V go


@dataclass(frozen=True, slots=True)
class SequenceChunk:
    """One request's share of a packed batch.

    rows [query_start, query_start + num_query_tokens) of the batch hold the request's
    positions [num_computed_tokens, context_len); positions [0, num_computed_tokens) already
    have KV in the cache.
    """

    query_start: int
    num_query_tokens: int
    num_computed_tokens: int
    # covers at least ceil(context_len / block_size) blocks; may be empty when the forward
    # runs without a KV cache (stateless prefill of whole sequences)
    block_ids: list[int]
    # A speculative step's rows: the request's next token and the drafts after it. A backend
    # may attend them as that many decode rows (row i sees num_computed_tokens + i + 1 tokens).
    drafts: bool = False

    @property
    def context_len(self) -> int:
        return self.num_computed_tokens + self.num_query_tokens

    @property
    def is_decode(self) -> bool:
        """One new token of a sequence that already has some in the cache."""
        return self.num_query_tokens == 1 and self.num_computed_tokens > 0


def slot_mapping(chunks: list[SequenceChunk], block_size: int) -> list[int] | None:
    """Cache slot of every packed row, in row order (chunks sorted by query_start); None
    when some chunk has no block table (stateless)."""
    if not all(c.block_ids for c in chunks):
        return None
    slots: list[int] = []
    for c in chunks:
        bt = c.block_ids
        slots.extend(
            bt[p // block_size] * block_size + p % block_size
            for p in range(c.num_computed_tokens, c.context_len)
        )
    return slots


def int_tensor(values: Sequence[int] | Sequence[Sequence[int]], device: torch.device | None = None) -> torch.Tensor:
    """torch.tensor(values, dtype=torch.int64, device=device). On the CPU it goes through numpy:
    about 1 us where torch.tensor takes 3-4, a few times a decode step (issue 33)."""
    if device is None or device.type == "cpu":
        return torch.from_numpy(np.asarray(values, dtype=np.int64))
    return torch.tensor(values, dtype=torch.int64, device=device)


def slots_tensor(chunks: list[SequenceChunk], block_size: int, device: torch.device) -> torch.Tensor | None:
    slots = slot_mapping(chunks, block_size)
    return None if slots is None else int_tensor(slots, device)


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache, slots: torch.Tensor | None) -> None:
    # k, v (T, Hkv, D) -> the cache rows named by slots (T,)
    if slots is None:
        raise ValueError("writing to the KV cache needs every chunk's block table")
    k_cache, v_cache = kv_cache
    nb, bs, hkv, d = k_cache.shape
    k_cache.view(nb * bs, hkv, d).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(nb * bs, hkv, d).index_copy_(0, slots, v.to(v_cache.dtype))


@dataclass(frozen=True, slots=True)
class HeadShape:
    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int


class CacheContractError(ValueError):
    """The KV cache (block size, dtype, head shape, layout) or the machine does not fit what a
    backend's kernel takes; raised at start-up, when the backend is chosen. The message names
    the backend and the mismatch."""


class AttentionBackend(ABC):
    """Builds per-step metadata once, then runs attention for every layer with it."""

    name: ClassVar[str]

    def __init__(self, block_size: int, device: torch.device) -> None:
        self.block_size = block_size
        self.device = device

    @classmethod
    def check_contract(
        cls, block_size: int, device: torch.device, dtype: torch.dtype, heads: HeadShape | None = None
    ) -> None:
        """Raise CacheContractError naming what of the cache or the machine this backend's kernel
        cannot take (heads None: what is known before the model's config is read)."""

    @classmethod
    def importable(cls) -> str | None:
        """None when the kernel's package can be imported, else why not (a sentence)."""
        return None

    @classmethod
    def supports(
        cls, block_size: int, device: torch.device, dtype: torch.dtype, heads: HeadShape | None = None
    ) -> bool:
        try:
            cls.check_contract(block_size, device, dtype, heads)
        except CacheContractError:
            return False
        return cls.importable() is None

    def check_cache(self, kv_cache: KVCache, heads: HeadShape) -> None:
        """The layout check, on a layer's allocated cache: K and V each (num_blocks, block_size,
        num_kv_heads, head_dim), innermost three dims packed (what every paged kernel here reads)."""
        for name, t in zip("KV", kv_cache):
            want = (self.block_size, heads.num_kv_heads, heads.head_dim)
            if t.dim() != 4 or tuple(t.shape[1:]) != want:
                raise CacheContractError(
                    f"attention backend {self.name!r}: the {name} cache is {tuple(t.shape)}, "
                    f"not (num_blocks, {', '.join(map(str, want))}) (KV layout)"
                )
            d = heads.head_dim
            if t.stride()[1:] != (heads.num_kv_heads * d, d, 1):
                raise CacheContractError(
                    f"attention backend {self.name!r}: the {name} cache's strides {t.stride()} are not "
                    f"those of packed (block_size, num_kv_heads, head_dim) rows (KV layout)"
                )

    def warm_up(self, kv_cache: KVCache, num_heads: int, scale: float) -> None:
        """Compile or load whatever the first step would (a worker calls this before it reports
        ready, so no request waits for it); the cache's contents are left as they are."""

    def paged_decode_plan(self, metadata: Any, kv_cache: KVCache) -> PagedDecodePlan | None:
        """The step's attention as native code may call it for every layer (PagedDecodePlan), where
        this backend reads `kv_cache` (any layer's: they are alike) with the CPU paged kernel and
        the step is decode rows alone; None otherwise (the layers call forward())."""
        return None

    @abstractmethod
    def build_metadata(self, chunks: list[SequenceChunk]) -> Any:
        """chunks sorted by query_start, contiguous, covering every packed row."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # (T, Hq, D), RoPE applied
        k: torch.Tensor,  # (T, Hkv, D), RoPE applied
        v: torch.Tensor,  # (T, Hkv, D)
        kv_cache: KVCache | None,  # None: stateless, every chunk must start at position 0
        metadata: Any,
        scale: float,
    ) -> torch.Tensor:
        """(T, Hq, D) attention output."""
