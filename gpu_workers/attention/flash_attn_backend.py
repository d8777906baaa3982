"""flash-attn's varlen kernel reading K/V straight from the paged cache (CUDA only): one call per
layer for every chunk of a step, prefills and decodes alike (paged_varlen.py has the contract).

Two builds of the same function:

- vllm_flash_attn: vLLM's build (`vllm.vllm_flash_attn`), present wherever vLLM is installed;
  it takes block_table with seqused_k, and any block size that is a multiple of 16;
- flash_attn: upstream flash-attn 2, whose paged path needs block_size a multiple of 256.

The packages are imported only when a backend is constructed (or asked whether it can be), so
CPU machines never load them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from gpu_workers.attention.backend import (
    AttentionBackend,
    CacheContractError,
    HeadShape,
    KVCache,
    SequenceChunk,
    write_kv,
)
from gpu_workers.attention.paged_varlen import PagedVarlenMetadata, build_paged_varlen

HALF_DTYPES = (torch.float16, torch.bfloat16)


def contract_problems(
    block_size: int, device: torch.device, dtype: torch.dtype, heads: HeadShape | None, *,
    block_multiple: int, head_dims: tuple[int, ...] | None = None, max_head_dim: int = 256,
) -> list[str]:  # fmt: skip
    """What of the cache a paged CUDA kernel cannot take, one phrase each (empty: all fits)."""
    problems = []
    if block_size % block_multiple:
        problems.append(f"block_size {block_size} (needs a multiple of {block_multiple})")
    if dtype not in HALF_DTYPES:
        problems.append(f"dtype {dtype} (needs float16 or bfloat16)")
    if heads is not None:
        d = heads.head_dim
        if head_dims is not None and d not in head_dims:
            problems.append(f"head_dim {d} (needs one of {', '.join(map(str, head_dims))})")
        elif head_dims is None and (d % 8 or d > max_head_dim):
            problems.append(f"head_dim {d} (needs a multiple of 8 up to {max_head_dim})")
        if heads.num_heads % heads.num_kv_heads:
            problems.append(f"{heads.num_heads} query heads over {heads.num_kv_heads} KV heads (needs a multiple)")
    if device.type != "cuda":
        problems.append(f"device {device} (needs CUDA)")
    return problems


def raise_problems(name: str, problems: list[str]) -> None:
    if problems:
        raise CacheContractError(f"attention backend {name!r} cannot take this KV cache: {'; '.join(problems)}")


# The long chunk prepare() runs: over FlashInfer's 64-row line between the FA2 and FA3 plans
# its `auto` would choose (prefill.py's _determine_auto_backend, 0.7.4), as the worker's
# profile run (one prefill of thousands of rows) is.
LONG_CHUNK_ROWS = 128


def scratch_cache(block_size: int, num_blocks: int, heads: HeadShape, dtype: torch.dtype, device: torch.device) -> KVCache:
    """K and V laid out as the runner's cache is: views of one (2, blocks, block_size, Hkv, D) tensor."""
    kv = torch.zeros(2, num_blocks, block_size, heads.num_kv_heads, heads.head_dim, dtype=dtype, device=device)
    return kv[0], kv[1]


class PagedKernelBackend(AttentionBackend):
    """A CUDA paged kernel: run once before the model loads (prepare), warmed up on the real
    cache before the worker reports ready, and its one call per layer."""

    def prepare(self, dtype: torch.dtype, heads: HeadShape) -> None:
        """Run the kernel on a scratch cache of the model's dtype and head shape, on both shapes a
        step takes (decode rows; a long prefill chunk), so that a kernel that cannot load, build
        or run here fails now, where create_attention_backend falls back, and not in the
        profile run or a request. Raises whatever the kernel raised."""
        self._exercise(dtype, heads)

    def _exercise(self, dtype: torch.dtype, heads: HeadShape) -> None:
        bs = self.block_size
        cache = scratch_cache(bs, -(-LONG_CHUNK_ROWS // bs) + 1, heads, dtype, self.device)
        scale = heads.head_dim**-0.5
        self.warm_up(cache, heads.num_heads, scale)
        # one fresh prefill of LONG_CHUNK_ROWS rows over blocks [1, ...]: reads only what it writes
        blocks = list(range(1, -(-LONG_CHUNK_ROWS // bs) + 1))
        m = self.build_metadata([SequenceChunk(0, LONG_CHUNK_ROWS, 0, blocks)])
        q = torch.zeros(LONG_CHUNK_ROWS, heads.num_heads, heads.head_dim, dtype=dtype, device=self.device)
        self._paged(q, cache, m, scale)

    def warm_up(self, kv_cache: KVCache, num_heads: int, scale: float) -> None:
        """One call on two rows reading block 0 (nothing is written): loads or compiles the kernel."""
        k_cache = kv_cache[0]
        m = self.build_metadata([SequenceChunk(0, 1, 1, [0]), SequenceChunk(1, 1, 0, [0])])
        q = torch.zeros(2, num_heads, k_cache.shape[-1], dtype=k_cache.dtype, device=k_cache.device)
        self._paged(q, kv_cache, m, scale)

    def _paged(self, q: torch.Tensor, kv_cache: KVCache, m: Any, scale: float) -> torch.Tensor:
        raise NotImplementedError


class _FlashVarlenBackend(PagedKernelBackend):
    BLOCK_MULTIPLE: ClassVar[int]
    PACKAGE: ClassVar[str]  # what to install, for the error
    INSTALL: ClassVar[str]  # how to get it, for the error

    @classmethod
    def _import(cls) -> Callable[..., torch.Tensor]:
        raise NotImplementedError

    @classmethod
    def check_contract(
        cls, block_size: int, device: torch.device, dtype: torch.dtype, heads: HeadShape | None = None
    ) -> None:
        raise_problems(cls.name, contract_problems(block_size, device, dtype, heads, block_multiple=cls.BLOCK_MULTIPLE))

    @classmethod
    def importable(cls) -> str | None:
        try:
            cls._import()
        except Exception as e:  # noqa: BLE001 - not only ImportError: a CUDA library's OSError, a RuntimeError at import
            return f"{cls.PACKAGE} cannot be imported ({type(e).__name__}: {e}); {cls.INSTALL}"
        return None

    def __init__(self, block_size: int, device: torch.device) -> None:
        super().__init__(block_size, device)
        self._varlen = self._import()

    def build_metadata(self, chunks: list[SequenceChunk]) -> PagedVarlenMetadata:
        return build_paged_varlen(chunks, self.block_size, self.device)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache | None,
        metadata: PagedVarlenMetadata,
        scale: float,
    ) -> torch.Tensor:
        m = metadata
        if kv_cache is None:
            if not m.all_fresh:
                raise ValueError("a chunk that continues a sequence needs a KV cache")
            # every chunk is its own whole context: varlen over the new K/V
            return self._varlen(  # type: ignore[call-arg]
                q, k, v, cu_seqlens_q=m.cu_seqlens_q, cu_seqlens_k=m.cu_seqlens_q, max_seqlen_q=m.max_seqlen_q,
                max_seqlen_k=m.max_seqlen_q, softmax_scale=scale, causal=True,
            )  # fmt: skip
        write_kv(k, v, kv_cache, m.slots)
        return self._paged(q, kv_cache, m, scale)


class VllmFlashAttnBackend(_FlashVarlenBackend):
    name = "vllm_flash_attn"
    BLOCK_MULTIPLE = 16
    PACKAGE = "vllm (its vllm.vllm_flash_attn)"
    INSTALL = "install vLLM into this venv (the vllm extra; it brings its own torch)"

    @classmethod
    def _import(cls) -> Callable[..., torch.Tensor]:
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        return flash_attn_varlen_func  # type: ignore[no-any-return]

    def _paged(self, q: torch.Tensor, kv_cache: KVCache, m: PagedVarlenMetadata, scale: float) -> torch.Tensor:
        # causal=True aligns the mask bottom-right (paged_varlen.py)
        kwargs: dict[str, Any] = {"softmax_scale": scale, "causal": True, "block_table": m.block_table}
        return self._varlen(  # type: ignore[call-arg]
            q, kv_cache[0], kv_cache[1], max_seqlen_q=m.max_seqlen_q, cu_seqlens_q=m.cu_seqlens_q,
            max_seqlen_k=m.max_seqlen_k, seqused_k=m.seqused_k, **kwargs,
        )  # fmt: skip


class FlashAttnBackend(_FlashVarlenBackend):
    name = "flash_attn"
    BLOCK_MULTIPLE = 256
    PACKAGE = "flash-attn"
    INSTALL = "pip install flash-attn --no-build-isolation (after torch); its pages are 256n tokens"

    @classmethod
    def _import(cls) -> Callable[..., torch.Tensor]:
        from flash_attn import flash_attn_varlen_func

        return flash_attn_varlen_func  # type: ignore[no-any-return]

    def _paged(self, q: torch.Tensor, kv_cache: KVCache, m: PagedVarlenMetadata, scale: float) -> torch.Tensor:
        return self._varlen(  # type: ignore[call-arg]
            q, kv_cache[0], kv_cache[1], cu_seqlens_q=m.cu_seqlens_q, cu_seqlens_k=m.cu_seqlens_k,
            max_seqlen_q=m.max_seqlen_q, max_seqlen_k=m.max_seqlen_k, softmax_scale=scale, causal=True,
            block_table=m.block_table,
        )  # fmt: skip
