"""Decode attention traced into the compiled decode step (gpu_workers/llm/decode_graph.py).

A decode row (one new token of a running sequence at position p = context_len - 1) attends over
the p tokens already in the paged cache and over its own new K/V. Inside the step's graph:

- nothing is written to the cache: each layer's new K/V join the step's outputs (`DecodeGraphMetadata
  .new_kv`), and the runner writes all layers' at once after the forward (one index_put);
- the cached part is read in place. On CUDA, by the attention backend's library
  (attention/library_decode.py: FlashInfer's or flash-attn's paged decode, one opaque op
  returning the log-sum-exp too), `meta.kernel` then being the key the op finds it by. Else by
  one of two kernels. "paged" (the default on the CPU where it builds) is
  attention/cpu_paged.py's C kernel, one opaque op that also merges the row's own token.
  "gather" (CUDA without a library kernel, and the CPU's fallback) states the scores as an
  elementwise product summed over the head dim, `(q * k_cache[table]).sum(-1)`, which inductor turns into one reduction
  loop that indexes the cache through the block table (no padded copy of the context exists),
  and the same for the weighted sum of V. (flex_attention with flex_paged.py's paged block mask
  in the same graph was tried: inductor's CPU lowering of flex_attention refuses return_lse in
  torch 2.13, which the merge below needs; taking it would mean writing the new K/V inside the
  graph, a mutation of the cache the layer graph would have to split around.)
- gather's (and a library's) cached part and the row's own token are merged by their
  log-sum-exp, so a row with nothing visible in the cache (a padding row of the bucket,
  context_len 1) sees only itself.

Padding rows of a bucket point their block table and their slot at a scratch block no request
owns, so their K/V land there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_workers.attention import cpu_paged
from gpu_workers.attention.backend import AttentionBackend, KVCache, PagedDecodePlan, SequenceChunk
from gpu_workers.attention.library_decode import library_paged_decode


@dataclass(slots=True)
class DecodeGraphMetadata:
    """A bucket's decode batch: B rows (real ones first), each one token."""

    block_table: torch.Tensor  # (B, M) int64: each row's blocks, padded with the scratch block
    context_lens: torch.Tensor  # (B,) int64: cached tokens + 1 (the row's own); 1 for padding
    block_size: int
    kernel: str = "gather"  # a DECODE_KERNELS name, or a library kernel's key (library_decode.register)
    # filled by the forward: every layer's (k, v), each (B, Hkv, D), in layer order
    new_kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


def _merge_self(
    out_cache: torch.Tensor, lse_cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax over [cached keys, own key]: out_cache (B, Hkv, G, D) and lse_cache (B, Hkv, G)
    over the cached part (lse -inf where none is visible), q (B, Hkv, G, D), k, v (B, Hkv, D)."""
    s_self = (q * k[:, :, None, :]).sum(-1) * scale  # (B, Hkv, G)
    m = torch.maximum(lse_cache, s_self)
    w_cache = torch.exp(lse_cache - m)
    w_self = torch.exp(s_self - m)
    total = w_cache + w_self
    return (out_cache * (w_cache / total)[..., None] + v[:, :, None, :] * (w_self / total)[..., None])


def gather_attention(
    q: torch.Tensor,  # (B, Hkv, G, D) float32 or the cache dtype
    k_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D)
    v_cache: torch.Tensor,
    block_table: torch.Tensor,  # (B, M) int64
    num_cached: torch.Tensor,  # (B,) int64 visible cached tokens
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over each row's first num_cached tokens; (out (B, Hkv, G, D), lse (B, Hkv, G))."""
    hkv, d = q.shape[1], q.shape[3]
    bs = k_cache.shape[1]
    s = block_table.shape[1] * bs
    pos = torch.arange(s, device=q.device)
    # (B, S) cache row of every key position, read through the table (no copy: an index)
    slots = block_table[:, pos // bs] * bs + pos % bs
    kf = k_cache.view(-1, hkv, d)
    vf = v_cache.view(-1, hkv, d)
    qf = q.float()
    # scores (B, S, Hkv, G): a reduction over D that reads K through `slots` in place
    scores = (qf[:, None] * kf[slots][:, :, :, None, :].float()).sum(-1) * scale
    visible = (pos[None, :] < num_cached[:, None])[:, :, None, None]
    scores = scores.masked_fill(~visible, float("-inf"))
    peak = scores.amax(1).clamp(min=-1e30)  # (B, Hkv, G); finite where nothing is visible
    p = torch.exp(scores - peak[:, None])  # 0 where masked
    denom = p.sum(1)  # (B, Hkv, G)
    out = (p[..., None] * vf[slots][:, :, :, None, :].float()).sum(1)  # (B, Hkv, G, D)
    lse = torch.where(denom > 0, peak + torch.log(denom), float("-inf"))
    return out / denom.clamp(min=1e-30)[..., None], lse


def gather_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    num_cached: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """gather_attention over the cache, merged with the rows' own k_new, v_new (B, Hkv, D)."""
    out_c, lse_c = gather_attention(q, k_cache, v_cache, block_table, num_cached, scale)
    return _merge_self(out_c, lse_c, q.float(), k_new.float(), v_new.float(), scale)


# name -> (q (B, Hkv, G, D), k_cache, v_cache, table, num_cached, k_new, v_new, scale) -> the
# attention over each row's cached tokens and its own, (B, Hkv, G, D) float32
DECODE_KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "gather": gather_decode,
    "paged": cpu_paged.paged_decode_attention,  # the CPU kernel: one opaque op, own token included
}


def default_kernel(k_cache: torch.Tensor) -> str:
    """"paged" where the CPU kernel is built and reads this (one layer's) cache, else "gather"."""
    return "paged" if cpu_paged.supports(k_cache) else "gather"


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache, meta: DecodeGraphMetadata, scale: float
) -> torch.Tensor:
    """(B, Hq, D) for q (B, Hq, D), k, v (B, Hkv, D) of the rows' own tokens; records (k, v)."""
    k_cache, v_cache = kv_cache
    b, hq, d = q.shape
    hkv = k.shape[1]
    k = k.to(k_cache.dtype)
    v = v.to(v_cache.dtype)
    meta.new_kv.append((k, v))
    qg = q.view(b, hkv, hq // hkv, d)
    num_cached = meta.context_lens - 1
    attend = DECODE_KERNELS.get(meta.kernel)
    if attend is not None:
        out = attend(qg, k_cache, v_cache, meta.block_table, num_cached, k, v, scale)
    else:  # a library's paged kernel over the cached tokens, then the row's own token merged in
        out_c, lse_c = library_paged_decode(q, k_cache, v_cache, meta.block_table, num_cached, scale, meta.kernel)
        out_c, lse_c = out_c.view(qg.shape).float(), lse_c.view(qg.shape[:3])
        out = _merge_self(out_c, lse_c, qg.float(), k.float(), v.float(), scale)
    return out.to(q.dtype).reshape(b, hq, d)


def write_new_kv(kv_cache: torch.Tensor, new_kv: torch.Tensor, slots: torch.Tensor) -> None:
    """kv_cache (L, 2, num_blocks, block_size, Hkv, D); new_kv (L, 2, B, Hkv, D); slots (B,)."""
    n_layers, two, nb, bs, hkv, d = kv_cache.shape
    kv_cache.view(n_layers, two, nb * bs, hkv, d).index_copy_(2, slots, new_kv)


class DecodeGraphBackend(AttentionBackend):
    """The runner's attention backend when a compiled decode step exists: a DecodeGraphMetadata
    (the compiled step's) takes decode_attention, anything else the wrapped backend."""

    name = "decode_graph"

    def __init__(self, inner: AttentionBackend) -> None:
        super().__init__(inner.block_size, inner.device)
        self.inner = inner

    def warm_up(self, kv_cache: KVCache, num_heads: int, scale: float) -> None:
        self.inner.warm_up(kv_cache, num_heads, scale)

    def build_metadata(self, chunks: list[SequenceChunk]) -> Any:
        return self.inner.build_metadata(chunks)

    def paged_decode_plan(self, metadata: Any, kv_cache: KVCache) -> PagedDecodePlan | None:
        if isinstance(metadata, DecodeGraphMetadata):
            return None
        return self.inner.paged_decode_plan(metadata, kv_cache)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache | None,
        metadata: Any,
        scale: float,
    ) -> torch.Tensor:
        if isinstance(metadata, DecodeGraphMetadata):
            assert kv_cache is not None
            return decode_attention(q, k, v, kv_cache, metadata, scale)
        return self.inner.forward(q, k, v, kv_cache, metadata, scale)
