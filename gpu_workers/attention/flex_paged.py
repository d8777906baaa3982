"""Paged attention on CPU: decodes read their K/V blocks in place through flex_attention,
compiled by inductor's C++ template.

Every decode row of a step (one new token of a running sequence) reads the cache where it
lies: the whole cache is handed to flex_attention as one key sequence of num_blocks *
block_size slots, and the block mask names, per row, the blocks it may see. Nothing of the
context is copied and no dense mask exists: a row at position p sees

- "full" blocks: block_ids[0 : (p + 1) // block_size], every slot unmasked;
- at most one "partial" block: block_ids[(p + 1) // block_size], its first (p + 1) % block_size
  slots (the only place the mask function runs).

Each decode row is a batch element of its own, its G = Hq / Hkv query heads folded into G
query rows against their shared KV head (one kernel pass over each block serves all G heads).
The per-row block lists are overlapping strided views of one (rows, max_blocks) table, so the
metadata is O(rows * max_blocks), not O(rows * num_blocks); it is built once per step.

Other chunks take SDPA's flash kernel (never the math one): a whole new prompt causal over its
own K/V; a later chunk of a prompt, or a prefix-cache hit, over its own blocks (copied once per
layer by index_select, the chunk's context only) with its causal mask. Through the paged
kernel those chunks were slower: each of their rows is a separate 16-slot-block walk, ~4x the
gather + flash SDPA time for a 128-token chunk in bf16.

flex_attention is compiled once per process with dynamic shapes (inductor also caches it on
disk across restarts); a worker does it before it reports ready (warm_up): about 18 s cold,
6 s with the disk cache warm, on a 2-core EPYC.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gpu_workers.attention.backend import (
    AttentionBackend,
    CacheContractError,
    HeadShape,
    KVCache,
    SequenceChunk,
    slots_tensor,
    write_kv,
)
from gpu_workers.attention.torch_sdpa import PrefillChunk, TorchSDPABackend

_compiled_attend: Callable[..., torch.Tensor] | None = None


def _attend(
    q: torch.Tensor,  # (R, Hkv, G, D)
    k: torch.Tensor,  # (R, Hkv, S, D): the whole cache, S = num_blocks * block_size, stride-0 over R
    v: torch.Tensor,
    table: torch.Tensor,  # (R, M) int32 block ids of each row's sequence, padded
    num_full: torch.Tensor,  # (R,) int32
    has_partial: torch.Tensor,  # (R,) int32, 0 or 1
    partial_block: torch.Tensor,  # (R,) int32 (block 0, never read, where has_partial is 0)
    end: torch.Tensor,  # (capacity,) int32: entry i is row i's first slot past its last visible one
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """flex_attention over the paged cache; the block mask is built here, inside the compiled
    region, so the table's width is a symbol like any size (built outside, it would be a
    stride that dynamo specialises on: one compile per width)."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    r, m = table.shape
    group = q.shape[2]
    num_blocks = k.shape[2] // block_size
    # Row i's full-block list starts at table[i, 0]; its view runs num_blocks entries on into
    # the next rows (never read: only the first num_full entries are), hence the tail padding.
    flat = torch.cat([table.flatten(), table.new_zeros(num_blocks)])
    full_idx = flat.as_strided((r, 1, 1, num_blocks), (m, 0, 0, 1))
    part = torch.cat([partial_block, partial_block.new_zeros(num_blocks)])
    part_idx = part.as_strided((r, 1, 1, num_blocks), (1, 0, 0, 1))

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        # evaluated only on the row's partial block, so comparing physical slots suffices
        return kv_idx < end[b]

    mask = BlockMask.from_kv_blocks(
        has_partial.view(r, 1, 1),
        part_idx,
        num_full.view(r, 1, 1),
        full_idx,
        BLOCK_SIZE=(group, block_size),
        mask_mod=mask_mod,
        seq_lengths=(group, num_blocks * block_size),
        compute_q_blocks=False,
    )
    return flex_attention(q, k, v, block_mask=mask, scale=scale)  # type: ignore[return-value]


def _compiled() -> Callable[..., torch.Tensor]:
    global _compiled_attend
    if _compiled_attend is None:
        import torch._dynamo.config as dynamo_config
        import torch.fx.experimental._config as fx_config

        compiled = torch.compile(_attend, dynamic=True)

        def call(*args: Any) -> torch.Tensor:
            # No duck sizing: sizes that happen to be equal when traced (two rows, two blocks)
            # would share one symbol, and the first step where they differ would compile again.
            # One graph serves a worker (per block size, dtype, head shape and scale); a process
            # that meets many (the tests) may compile more than dynamo's default 8 times, and past
            # that limit dynamo would run flex_attention eagerly, where the mask function is
            # evaluated on every block, not only the partial ones, and the result is wrong: so
            # a higher limit, and an error rather than that fallback. (Plain assignments: the
            # config modules' patch() costs ~200 us a call, every layer of every step.)
            saved = (fx_config.use_duck_shape, dynamo_config.recompile_limit,
                     dynamo_config.fail_on_recompile_limit_hit)  # fmt: skip
            fx_config.use_duck_shape = False
            dynamo_config.recompile_limit = max(64, saved[1])
            dynamo_config.fail_on_recompile_limit_hit = True
            try:
                return compiled(*args)  # type: ignore[no-any-return]
            finally:
                (fx_config.use_duck_shape, dynamo_config.recompile_limit,
                 dynamo_config.fail_on_recompile_limit_hit) = saved  # fmt: skip

        _compiled_attend = call
    return _compiled_attend


def cpu_flex_supported() -> bool:
    """inductor's C++ flex template needs an x86 CPU with AVX2 (torch's own check) and a C++
    compiler inductor can find (g++ or $CXX)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported

        get_cpp_compiler()  # raises when there is none
    except Exception:  # noqa: BLE001 - any failure to find the toolchain means "not here"
        return False
    return bool(check_cpu_supported())


@dataclass(slots=True)
class PagedRows:
    """The continuing rows of a step, each a batch element of the flex call."""

    rows: torch.Tensor  # (R,) packed-batch rows, in order; R >= 2 (see _MIN_ROWS)
    num_real: int  # the first num_real entries are real rows, the rest repeat the last one
    positions: torch.Tensor  # (R,) int64 position of each row in its sequence
    table: torch.Tensor  # (R, M) int32: the row's sequence's block ids, padded with 0
    num_full: torch.Tensor  # (R,) int32 full blocks: (position + 1) // block_size
    partial_len: torch.Tensor  # (R,) int32 visible slots of the partial block: (position + 1) % block_size
    contiguous: bool  # rows == arange(R) and every packed row is continuing (pure decode)


@dataclass(slots=True)
class FlexPagedMetadata:
    num_tokens: int
    slots: torch.Tensor | None  # (T,) int64 cache slot of each packed row; None: stateless
    paged: PagedRows | None
    # every other chunk: a whole new prompt (block_ids None) or a later chunk of a prompt
    prefills: list[PrefillChunk]
    # built by the first layer's forward, then shared by every layer of the step
    mask_inputs: _MaskInputs | None = None


# dynamic shapes specialise sizes 0 and 1: pad the batch of rows and the table width to at
# least 2 so a one-sequence decode reuses the compiled kernel instead of compiling another
_MIN_ROWS = 2


def paged_rows(chunks: list[SequenceChunk], block_size: int, device: torch.device) -> PagedRows | None:
    """Per-row block lists of the decode rows (None when there is none)."""
    cont = [c for c in chunks if c.is_decode]
    if not cont:
        return None
    if not all(c.block_ids for c in cont):
        raise ValueError("a chunk that continues a sequence needs its block table")
    width = max(_MIN_ROWS, max(-(-c.context_len // block_size) for c in cont))
    tables = [c.block_ids[: -(-c.context_len // block_size)] for c in cont]
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)  # (C, M)
    counts = torch.tensor([c.num_query_tokens for c in cont])
    first = torch.tensor([c.query_start for c in cont]) - torch.tensor([c.num_computed_tokens for c in cont])
    num_real = int(counts.sum())
    if num_real < _MIN_ROWS:  # repeat the last row
        counts[-1] += _MIN_ROWS - num_real
    chunk_of_row = torch.repeat_interleave(torch.arange(len(cont)), counts)  # (R,)
    # each chunk's rows are consecutive in the batch and in their sequence's positions
    starts = torch.tensor([c.num_computed_tokens for c in cont])
    offsets = torch.arange(chunk_of_row.shape[0]) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    pos = (starts[chunk_of_row] + offsets).clamp(max=torch.tensor([c.context_len - 1 for c in cont])[chunk_of_row])
    rows = first[chunk_of_row] + pos
    num_tokens = sum(c.num_query_tokens for c in chunks)
    return PagedRows(
        rows=rows.to(device),
        num_real=num_real,
        positions=pos.to(device),
        table=table[chunk_of_row].to(device),
        num_full=((pos + 1) // block_size).to(torch.int32).to(device),
        partial_len=((pos + 1) % block_size).to(torch.int32).to(device),
        contiguous=num_real == rows.shape[0] == num_tokens and bool((rows == torch.arange(num_tokens)).all()),
    )


def visible_slots(p: PagedRows, block_size: int) -> list[list[int]]:
    """The cache slots each real row attends to, read back from its block lists (for tests)."""
    out = []
    for r in range(p.num_real):
        nf, rem = int(p.num_full[r]), int(p.partial_len[r])
        blocks = p.table[r].tolist()
        slots = [b * block_size + o for b in blocks[:nf] for o in range(block_size)]
        if rem:
            slots += [blocks[nf] * block_size + o for o in range(rem)]
        out.append(slots)
    return out


_ROW_CAPACITY = 1 << 14


def _row_buffer(rows: int, device: torch.device) -> torch.Tensor:
    """A fresh (capacity,) int32 buffer for per-row mask data, its size static to the compiler.

    inductor's C++ flex template cannot name a symbolic size of a tensor the mask function
    reads (the generated kernel refers to an undeclared `cur_qSplitSize<n>`), so the buffer
    has a fixed size: 16k rows, or the next power of two above (one more compile then).
    """
    capacity = max(_ROW_CAPACITY, 1 << (rows - 1).bit_length())
    buf = torch.zeros(capacity, dtype=torch.int32, device=device)
    torch._dynamo.mark_static(buf)
    return buf


@dataclass(slots=True)
class _MaskInputs:
    """What the compiled kernel's block mask is built from, computed once per step."""

    has_partial: torch.Tensor  # (R,) int32
    partial_block: torch.Tensor  # (R,) int32
    end: torch.Tensor  # (capacity,) int32, see _row_buffer


def _mask_inputs(p: PagedRows, block_size: int) -> _MaskInputs:
    r, m = p.table.shape
    has_partial = p.partial_len > 0
    last = p.table.gather(1, p.num_full.clamp(max=m - 1).long()[:, None])[:, 0]
    end = _row_buffer(r, p.table.device)
    end[:r] = last * block_size + p.partial_len
    return _MaskInputs(has_partial.to(torch.int32), torch.where(has_partial, last, 0).to(torch.int32), end)


class FlexPagedBackend(AttentionBackend):
    name = "flex_paged"

    @classmethod
    def check_contract(
        cls, block_size: int, device: torch.device, dtype: torch.dtype, heads: HeadShape | None = None
    ) -> None:
        problems = []
        if dtype not in (torch.float32, torch.bfloat16):
            problems.append(f"dtype {dtype} (needs float32 or bfloat16)")
        if device.type != "cpu":
            problems.append(f"device {device} (needs the CPU)")
        if problems:
            raise CacheContractError(f"attention backend {cls.name!r} cannot take this KV cache: {'; '.join(problems)}")

    @classmethod
    def importable(cls) -> str | None:
        return None if cpu_flex_supported() else "inductor's C++ flex_attention needs an AVX2 CPU and a C++ compiler"

    def warm_up(self, kv_cache: KVCache, num_heads: int, scale: float) -> None:
        """Compile flex_attention for this cache's dtype and head grouping: two decode rows
        reading block 0 (nothing is written)."""
        k_cache = kv_cache[0]
        _, bs, _, dim = k_cache.shape
        chunks = [SequenceChunk(0, 1, bs, [0, 0]), SequenceChunk(1, 1, 1, [0])]
        with torch.inference_mode():  # as the runner's steps: tensors made here match its guards
            q = torch.zeros(2, num_heads, dim, dtype=k_cache.dtype, device=k_cache.device)
            self._paged(q, kv_cache, self.build_metadata(chunks), scale)

    def build_metadata(self, chunks: list[SequenceChunk]) -> FlexPagedMetadata:
        bs, dev = self.block_size, self.device
        prefills = []
        for c in chunks:
            if c.is_decode:
                continue
            block_ids = mask = None
            if c.num_computed_tokens > 0:
                block_ids = torch.tensor(c.block_ids[: -(-c.context_len // bs)], device=dev)
                q_pos = torch.arange(c.num_computed_tokens, c.context_len, device=dev)
                mask = torch.arange(c.context_len, device=dev)[None, :] <= q_pos[:, None]  # (n, ctx)
            prefills.append(
                PrefillChunk(c.query_start, c.query_start + c.num_query_tokens, c.context_len, block_ids, mask)
            )
        return FlexPagedMetadata(
            num_tokens=sum(c.num_query_tokens for c in chunks),
            slots=slots_tensor(chunks, bs, dev),
            paged=paged_rows(chunks, bs, dev),
            prefills=prefills,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache | None,
        metadata: FlexPagedMetadata,
        scale: float,
    ) -> torch.Tensor:
        m = metadata
        if kv_cache is not None:
            write_kv(k, v, kv_cache, m.slots)
        if m.paged is None and len(m.prefills) == 1:
            return TorchSDPABackend._prefill(q, k, v, kv_cache, m.prefills[0], scale)
        if m.paged is not None and m.paged.contiguous:
            return self._paged(q, kv_cache, m, scale)  # pure decode: no scatter
        out = torch.empty_like(q)  # (T, Hq, D)
        if m.paged is not None:
            out.index_copy_(0, m.paged.rows[: m.paged.num_real], self._paged(q, kv_cache, m, scale))
        for p in m.prefills:
            out[p.start : p.end] = TorchSDPABackend._prefill(q, k, v, kv_cache, p, scale)
        return out

    def _paged(self, q: torch.Tensor, kv_cache: KVCache | None, m: FlexPagedMetadata, scale: float) -> torch.Tensor:
        p = m.paged
        assert p is not None
        if kv_cache is None:
            raise ValueError("a chunk that continues a sequence needs a KV cache")
        k_cache, v_cache = kv_cache
        nb, bs, hkv, dim = k_cache.shape
        hq = q.shape[1]
        group = hq // hkv
        if m.mask_inputs is None:
            m.mask_inputs = _mask_inputs(p, bs)
        mi = m.mask_inputs
        r = p.rows.shape[0]
        qr = q if p.contiguous else q.index_select(0, p.rows)
        qr = qr.to(k_cache.dtype).view(r, hkv, group, dim)  # (R, Hkv, G, D)
        # the whole cache as one key sequence per KV head, shared by every row (stride-0 batch)
        kf = k_cache.view(1, nb * bs, hkv, dim).transpose(1, 2).expand(r, -1, -1, -1)  # (R, Hkv, S, D)
        vf = v_cache.view(1, nb * bs, hkv, dim).transpose(1, 2).expand(r, -1, -1, -1)
        o = _compiled()(
            qr, kf, vf, p.table, p.num_full, mi.has_partial, mi.partial_block, mi.end, bs, scale
        )  # (R, Hkv, G, D)
        return o.reshape(r, hq, dim)[: p.num_real].to(q.dtype)  # (R', Hq, D)
