"""Attention with torch's scaled_dot_product_attention over the paged cache (CPU and GPU).

On the CPU every chunk that reads cached K/V reads it in place, through the paged kernel of
attention/cpu_paged.py: all single-token chunks of a step (decodes) in ONE call per layer, and
all chunks that continue a sequence (a later chunk of a long prompt, or a prefix-cache hit) in
one more, causal within each chunk. No context is copied out of the cache and no mask is built.
A chunk that starts a sequence (the whole context so far is its own tokens) runs SDPA's causal
kernel over its own K/V, on every device.

Elsewhere (CUDA, or a CPU where the kernel did not build, or a cache it cannot read), decodes go
through one padded gather of the rows' contexts and one masked SDPA call, and each continuing
chunk through one SDPA call over its own blocks, copied out. No call needs SDPA's math kernel
(finding A5): a continuing chunk folds its G = Hq / Hkv query heads into G query rows against
their shared KV head, as decodes do, so K/V are never repeated and no GQA flag is set; its causal
mask is an additive float mask over the folded rows, built once per step on the device and shared
by every layer. That is what the flash (CPU) and memory-efficient (CUDA) kernels take; GQA
together with a mask is what CUDA sends to the math kernel, which materialises fp32 scores for
every query head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gpu_workers.attention import cpu_paged
from gpu_workers.attention.backend import (
    AttentionBackend,
    KVCache,
    PagedDecodePlan,
    SequenceChunk,
    int_tensor,
    slots_tensor,
    write_kv,
)

# SDPA grew enable_gqa in torch 2.5; older versions get repeated K/V heads instead.
_SDPA_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def _sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: object) -> torch.Tensor:
    # q (1, Hq, n, D); k, v (1, Hkv, ctx, D)
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
    if _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)  # type: ignore[arg-type]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]


@dataclass(slots=True)
class DecodeBatch:
    rows: torch.Tensor  # (B,) packed-batch rows of the single-token chunks
    block_table: torch.Tensor  # (B, max_blocks) int64, padded with block 0 (masked out)
    context_lens: torch.Tensor  # (B,) int64
    # (B, 1, 1, max_blocks * block_size) bool: key position < context_len; None: the paged kernel
    mask: torch.Tensor | None
    every_row: bool = False  # the step is these rows alone, in order (rows == arange(B))


@dataclass(slots=True)
class PrefillChunk:
    start: int  # packed rows [start, end)
    end: int
    context_len: int
    # Set only when the chunk continues a sequence (num_computed_tokens > 0):
    block_ids: torch.Tensor | None  # (ceil(context_len / block_size),) blocks holding [0, context_len)
    # (n, context_len) bool: query i (position start_pos + i) sees keys [0, start_pos + i]; None
    # until a path needs it (causal_mask())
    mask: torch.Tensor | None
    # mask with each query row repeated G times (row i * G + g), additive (0 or -inf) in the
    # queries' dtype: made by the first layer's call, then shared by the step's other layers
    folded_mask: torch.Tensor | None = None

    def causal_mask(self, device: torch.device) -> torch.Tensor:
        if self.mask is None:
            n = self.end - self.start
            q_pos = torch.arange(self.context_len - n, self.context_len, device=device)
            self.mask = torch.arange(self.context_len, device=device)[None, :] <= q_pos[:, None]
        return self.mask


@dataclass(slots=True)
class ContinuingBatch:
    """The step's continuing chunks for the paged CPU kernel: chunk c is packed rows
    [q_start[c], q_start[c] + q_len[c]), causal over the first context_lens[c] cached tokens."""

    block_table: torch.Tensor  # (C, max_blocks) int64, padded with block 0 (never read)
    q_start: torch.Tensor  # (C,) int64
    q_len: torch.Tensor  # (C,) int64
    context_lens: torch.Tensor  # (C,) int64


@dataclass(slots=True)
class SDPAMetadata:
    num_tokens: int
    slots: torch.Tensor | None  # (T,) int64 cache slot of each packed row; None: stateless
    decode: DecodeBatch | None
    prefills: list[PrefillChunk]  # every multi-token chunk, in order
    continuing: ContinuingBatch | None = None  # the continuing ones, where the paged kernel reads them


class TorchSDPABackend(AttentionBackend):
    name = "torch_sdpa"
    # decode rows and continuing chunks through the paged CPU kernel where it is built (False:
    # the padded gather and masked SDPA, as on CUDA)
    paged_kernel = True

    def _use_paged(self) -> bool:
        return self.paged_kernel and self.device.type == "cpu" and cpu_paged.available()

    def warm_up(self, kv_cache: KVCache, num_heads: int, scale: float) -> None:
        self._use_paged()  # builds the kernel (seconds, once per machine) before the worker is ready

    def build_metadata(self, chunks: list[SequenceChunk]) -> SDPAMetadata:
        bs, dev = self.block_size, self.device
        num_tokens = sum(c.num_query_tokens for c in chunks)
        if self._use_paged():
            chunks = _rows_as_decodes(chunks)
        decodes = [c for c in chunks if c.is_decode]
        decode = None
        if decodes:
            table = _padded_table(decodes, bs)
            lens = int_tensor([c.context_len for c in decodes])
            decode_mask = None
            if not self._use_paged():
                valid = torch.arange(len(table[0]) * bs)[None, :] < lens[:, None]  # (B, S)
                decode_mask = valid[:, None, None, :].to(dev)
            decode = DecodeBatch(
                rows=int_tensor([c.query_start for c in decodes], dev),
                block_table=int_tensor(table, dev),
                context_lens=lens.to(dev),
                mask=decode_mask,
                every_row=len(decodes) == len(chunks),
            )
        prefills = []
        for c in chunks:
            if c.is_decode:
                continue
            block_ids = None
            if c.num_computed_tokens > 0:
                block_ids = int_tensor(c.block_ids[: -(-c.context_len // bs)], dev)
            prefills.append(PrefillChunk(c.query_start, c.query_start + c.num_query_tokens, c.context_len, block_ids, None))
        continuing = None
        later = [c for c in chunks if not c.is_decode and c.num_computed_tokens > 0]
        if later and self._use_paged():
            continuing = ContinuingBatch(
                block_table=int_tensor(_padded_table(later, bs)),
                q_start=int_tensor([c.query_start for c in later]),
                q_len=int_tensor([c.num_query_tokens for c in later]),
                context_lens=int_tensor([c.context_len for c in later]),
            )
        slots = slots_tensor(chunks, bs, dev)
        return SDPAMetadata(num_tokens, slots, decode, prefills, continuing)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache | None,
        metadata: SDPAMetadata,
        scale: float,
    ) -> torch.Tensor:
        decode, later = metadata.decode, metadata.continuing
        if kv_cache is not None:
            slots = metadata.slots
            if decode is not None and decode.every_row and decode.mask is None and slots is not None \
                    and _kernel_writes(k, v, kv_cache):  # fmt: skip
                # a decode-only step: the kernel writes the rows' K/V and reads the cache in one call
                return self._decode(q, kv_cache, decode, scale, (k, v, slots))
            write_kv(k, v, kv_cache, metadata.slots)
        if decode is None and len(metadata.prefills) == 1 and later is None:
            return self._prefill(q, k, v, kv_cache, metadata.prefills[0], scale)
        if (decode is not None or later is not None) and kv_cache is None:
            raise ValueError("chunks that read cached tokens need a KV cache")
        if decode is not None and decode.every_row:  # a decode-only step: its rows, in order
            assert kv_cache is not None
            return self._decode(q, kv_cache, decode, scale)
        in_place = None  # the continuing chunks' rows, read by the paged kernel (fp32)
        if later is not None:
            assert kv_cache is not None
            if cpu_paged.supports(kv_cache[0]):
                t, hq, dim = q.shape
                hkv = kv_cache[0].shape[2]
                folded = q.view(t, hkv, hq // hkv, dim)  # (T, Hkv, G, D): the G heads of a KV head together
                in_place = cpu_paged.attend_chunks(
                    folded, *kv_cache, later.block_table, later.q_start, later.q_len, later.context_lens, scale
                ).view(t, hq, dim)
        out = torch.empty_like(q)  # (T, Hq, D)
        if decode is not None:
            assert kv_cache is not None
            out.index_copy_(0, decode.rows, self._decode(q, kv_cache, decode, scale))
        for p in metadata.prefills:
            if in_place is not None and p.block_ids is not None:
                out[p.start : p.end] = in_place[p.start : p.end]
            else:
                out[p.start : p.end] = self._prefill(q, k, v, kv_cache, p, scale)
        return out

    def paged_decode_plan(self, metadata: Any, kv_cache: KVCache) -> PagedDecodePlan | None:
        decode = metadata.decode if isinstance(metadata, SDPAMetadata) else None
        if decode is None or not decode.every_row or decode.mask is not None or metadata.slots is None:
            return None
        if metadata.prefills or metadata.continuing is not None or not self._use_paged():
            return None
        if not cpu_paged.supports(kv_cache[0]) or kv_cache[0].dtype != kv_cache[1].dtype:
            return None
        table, lens, slots = decode.block_table, decode.context_lens, metadata.slots
        if any(t.dtype != torch.int64 or not t.is_contiguous() for t in (table, lens, slots)):
            return None
        return PagedDecodePlan(cpu_paged.decode_entry(), table, lens, slots)

    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: KVCache,
        d: DecodeBatch,
        scale: float,
        write: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        k_cache, v_cache = kv_cache
        _, bs, hkv, dim = k_cache.shape
        b, hq = d.rows.shape[0], q.shape[1]
        # The G = Hq / Hkv query heads sharing a KV head become G query rows against it: one
        # position each, so no causal mask between them and no repeated K/V.
        qd = (q if d.every_row else q.index_select(0, d.rows)).view(b, hkv, hq // hkv, dim)  # (B, Hkv, G, D)
        if d.mask is None:
            if cpu_paged.supports(k_cache):
                # in place; the rows' own K/V are in the cache already (written by forward), or
                # written by this call first
                out_dtype = torch.bfloat16 if q.dtype == torch.bfloat16 else torch.float32
                od = cpu_paged.attend(
                    qd, k_cache, v_cache, d.block_table, d.context_lens, None, None, scale, write, out_dtype
                )
                return od.to(q.dtype).reshape(b, hq, dim)
            # a cache the kernel cannot read (its dtype or head dim): the mask after all, once a step
            valid = torch.arange(d.block_table.shape[1] * bs, device=q.device)[None, :] < d.context_lens[:, None]
            d.mask = valid[:, None, None, :]
        s = d.block_table.shape[1] * bs
        kd = k_cache[d.block_table].view(b, s, hkv, dim).transpose(1, 2)  # (B, Hkv, S, D)
        vd = v_cache[d.block_table].view(b, s, hkv, dim).transpose(1, 2)  # (B, Hkv, S, D)
        od = F.scaled_dot_product_attention(qd, kd.to(q.dtype), vd.to(q.dtype), attn_mask=d.mask, scale=scale)
        return od.reshape(b, hq, dim)  # (B, Hq, D)

    @staticmethod
    def _prefill(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache | None,
        p: PrefillChunk,
        scale: float,
    ) -> torch.Tensor:
        qp = q[p.start : p.end].transpose(0, 1)[None]  # (1, Hq, n, D)
        if p.block_ids is None:
            # the chunk is the whole context so far: plain causal over its own K/V
            kp = k[p.start : p.end].transpose(0, 1)[None]  # (1, Hkv, n, D)
            vp = v[p.start : p.end].transpose(0, 1)[None]
            op = _sdpa_gqa(qp, kp, vp, is_causal=True, scale=scale)
        else:
            if kv_cache is None:
                raise ValueError("a chunk that continues a sequence needs a KV cache")
            k_cache, v_cache = kv_cache
            hkv, dim = k_cache.shape[2:]
            # this chunk's own blocks only (index_select copies whole blocks, faster than [])
            kp = k_cache.index_select(0, p.block_ids).view(-1, hkv, dim)[: p.context_len]  # (ctx, Hkv, D)
            vp = v_cache.index_select(0, p.block_ids).view(-1, hkv, dim)[: p.context_len]
            kp = kp.transpose(0, 1)[None].to(q.dtype)  # (1, Hkv, ctx, D)
            vp = vp.transpose(0, 1)[None].to(q.dtype)
            return _continuing(q[p.start : p.end], kp, vp, p, scale)
        return op[0].transpose(0, 1)  # (n, Hq, D)


def _rows_as_decodes(chunks: list[SequenceChunk]) -> list[SequenceChunk]:
    """Speculative steps' chunks as one decode row per token: row i sees the first
    num_computed_tokens + i + 1 tokens, its own K/V written with the step's before any is read,
    which is the chunk's causal attention. The rows then join a decode step's paged kernel call,
    and models' native decode (models/llama_small_m.py) takes the step whole."""
    if not any(c.drafts for c in chunks):
        return chunks
    out: list[SequenceChunk] = []
    for c in chunks:
        if c.drafts:
            out += [SequenceChunk(c.query_start + i, 1, c.num_computed_tokens + i, c.block_ids) for i in range(c.num_query_tokens)]
        else:
            out.append(c)
    return out


def _padded_table(chunks: list[SequenceChunk], bs: int) -> list[list[int]]:
    """Each chunk's blocks holding its context, padded with block 0 to the longest context's count."""
    width = -(-max(c.context_len for c in chunks) // bs)
    tables = [c.block_ids[: -(-c.context_len // bs)] for c in chunks]
    return [t + [0] * (width - len(t)) for t in tables]


def _kernel_writes(k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache) -> bool:
    """Whether the paged kernel can write these rows (T, Hkv, D) into the cache itself: it reads
    the cache, and each row is contiguous in the cache's dtype."""
    k_cache = kv_cache[0]
    return (
        cpu_paged.supports(k_cache)
        and k.dtype == v.dtype == k_cache.dtype
        and k.stride()[1:] == v.stride()[1:] == (k.shape[2], 1)
    )


def _continuing(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: PrefillChunk, scale: float) -> torch.Tensor:
    """q (n, Hq, D) at positions [context_len - n, context_len); k, v (1, Hkv, ctx, D): (n, Hq, D),
    the G query heads of each KV head folded into query rows (no GQA, so no math kernel)."""
    n, hq, dim = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    if p.folded_mask is None or p.folded_mask.dtype != q.dtype:
        hidden = ~p.causal_mask(q.device).repeat_interleave(group, 0)  # (n * G, ctx)
        p.folded_mask = torch.zeros(hidden.shape, dtype=q.dtype, device=q.device).masked_fill_(hidden, float("-inf"))
    qf = q.view(n, hkv, group, dim).transpose(0, 1).reshape(1, hkv, n * group, dim)  # row i * G + g
    of = F.scaled_dot_product_attention(qf, k, v, attn_mask=p.folded_mask, scale=scale)  # (1, Hkv, n * G, D)
    return of.view(hkv, n, group, dim).transpose(0, 1).reshape(n, hq, dim)
