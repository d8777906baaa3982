"""The paged flex_attention backend against the dense reference and the torch SDPA backend.

Worst differences measured (CPU, torch 2.13): fp32 against the float64-free dense reference
and against TorchSDPABackend, < 2e-6; bf16 against TorchSDPABackend run in bf16, < 1.6e-2
(both round q·k and the probabilities to bf16 at different points). The first forward in a
process compiles flex_attention (about 20 s cold, 7 s with inductor's disk cache).
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpu_workers.attention.backend import SequenceChunk, slot_mapping
from gpu_workers.attention.flex_paged import FlexPagedBackend, cpu_flex_supported, paged_rows, visible_slots
from gpu_workers.attention.registry import create_attention_backend
from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from tests.gpu_workers.attention.test_backends import HKV, HQ, D, reference, run_backend, scenario

pytestmark = pytest.mark.skipif(not cpu_flex_supported(), reason="inductor's CPU flex_attention needs AVX2")
CPU = torch.device("cpu")


def mixed_batch(block_size: int, num_blocks: int = 64, seed: int = 3) -> list[SequenceChunk]:
    """Decodes, a fresh prompt, a later prefill chunk and two prefix-cache hits sharing the
    first blocks of another sequence, with shuffled block tables."""
    rng = random.Random(seed)
    free = list(range(num_blocks))
    rng.shuffle(free)

    def blocks(n: int) -> list[int]:
        return [free.pop() for _ in range(n)]

    bs = block_size
    shared = blocks(2)  # a cached prefix of 2 full blocks
    chunks: list[SequenceChunk] = []
    # (num_computed, num_query, block ids)
    specs = [
        (11, 1, blocks(-(-12 // bs))),  # decode
        (0, 9, blocks(-(-9 // bs))),  # a whole new prompt
        (2 * bs, 5, shared + blocks(-(-5 // bs))),  # prefix hit: the rest of its prompt
        (bs - 1, 1, blocks(1)),  # decode filling a block to its edge
        (3, 2 * bs + 1, blocks(-(-(2 * bs + 4) // bs))),  # a later chunk of a long prompt
        (2 * bs, 1, shared + blocks(1)),  # prefix hit with one token left
        (2 * bs + 2, 1, blocks(-(-(2 * bs + 3) // bs))),  # decode
    ]
    start = 0
    for computed, n, ids in specs:
        chunks.append(SequenceChunk(start, n, computed, ids))
        start += n
    return chunks


def sdpa_visible_slots(chunks: list[SequenceChunk], block_size: int) -> list[list[int]]:
    """The slots the torch SDPA path lets each continuing row see, from ITS metadata: the
    decode batch's padded block table and context lengths, the prefill chunks' block ids and masks."""
    meta = TorchSDPABackend(block_size, CPU).build_metadata(chunks)
    seen: dict[int, list[int]] = {}
    if meta.decode is not None:
        table, lens = meta.decode.block_table, meta.decode.context_lens
        mask = torch.arange(table.shape[1] * block_size)[None, :] < lens[:, None]  # (the paged kernel's bound)
        for i, row in enumerate(meta.decode.rows.tolist()):
            slots = (table[i][:, None] * block_size + torch.arange(block_size)).flatten()
            seen[row] = slots[mask[i]].tolist()
    for p in meta.prefills:
        if p.block_ids is None:
            continue
        slots = (p.block_ids[:, None] * block_size + torch.arange(block_size)).flatten()[: p.context_len]
        mask = p.causal_mask(CPU)
        for i in range(p.end - p.start):
            seen[p.start + i] = slots[mask[i]].tolist()
    return [seen[r] for r in sorted(seen)]


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_metadata_matches_the_sdpa_paths_indices(block_size: int) -> None:
    chunks = mixed_batch(block_size)
    meta = FlexPagedBackend(block_size, CPU).build_metadata(chunks)
    old = TorchSDPABackend(block_size, CPU).build_metadata(chunks)
    assert meta.paged is not None and old.decode is not None
    # the rows read through the paged kernel are exactly the decode rows, in order, and each
    # sees the slots the SDPA path's padded table and mask let it see
    assert meta.paged.rows[: meta.paged.num_real].tolist() == old.decode.rows.tolist()
    decode_rows = set(old.decode.rows.tolist())
    seen = dict(zip(sorted(decode_rows | {r for p in old.prefills if p.block_ids is not None for r in range(p.start, p.end)}),
                    sdpa_visible_slots(chunks, block_size)))  # fmt: skip
    assert visible_slots(meta.paged, block_size) == [seen[r] for r in sorted(decode_rows)]
    # every other chunk: the same rows, blocks and causal mask as the SDPA path
    assert len(meta.prefills) == len(old.prefills)
    for new_p, old_p in zip(meta.prefills, old.prefills):
        assert (new_p.start, new_p.end, new_p.context_len) == (old_p.start, old_p.end, old_p.context_len)
        a, b = new_p.block_ids, old_p.block_ids
        assert (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
        if b is not None:  # a continuing chunk: the same causal mask (the SDPA path builds it when asked)
            assert new_p.mask is not None and torch.equal(new_p.mask, old_p.causal_mask(CPU))
    assert meta.slots is not None and meta.slots.tolist() == slot_mapping(chunks, block_size)


def test_a_single_decode_pads_to_two_rows() -> None:
    p = paged_rows([SequenceChunk(0, 1, 5, [7, 2])], 4, CPU)
    assert p is not None and p.num_real == 1 and p.rows.tolist() == [0, 0] and p.table.shape == (2, 2)


@pytest.mark.parametrize("block_size", [16, 32, 8, 4])
def test_flex_paged_matches_reference(block_size: int) -> None:
    run_backend(FlexPagedBackend(block_size, CPU), "cpu", torch.float32, block_size)


def filled_cache(chunks: list[SequenceChunk], block_size: int, dtype: torch.dtype, num_blocks: int = 64) -> tuple[
    tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor
]:  # fmt: skip
    """A cache holding every chunk's history (shared prefix blocks written once, identically),
    and the step's q, k, v."""
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(num_blocks, block_size, HKV, D, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, HKV, D, generator=gen).to(dtype)
    t = sum(c.num_query_tokens for c in chunks)
    q = torch.randn(t, HQ, D, generator=gen).to(dtype)
    k = torch.randn(t, HKV, D, generator=gen).to(dtype)
    v = torch.randn(t, HKV, D, generator=gen).to(dtype)
    return (k_cache, v_cache), q, k, v


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 2e-6), (torch.bfloat16, 1.6e-2)])
def test_flex_paged_equals_torch_sdpa_on_a_mixed_batch(dtype: torch.dtype, tol: float) -> None:
    bs = 16
    chunks = mixed_batch(bs)
    (kc, vc), q, k, v = filled_cache(chunks, bs, dtype)
    old_cache = (kc.clone(), vc.clone())
    old = TorchSDPABackend(bs, CPU)
    new = FlexPagedBackend(bs, CPU)
    expected = old.forward(q, k, v, old_cache, old.build_metadata(chunks), 0.125)
    got = new.forward(q, k, v, (kc, vc), new.build_metadata(chunks), 0.125)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(kc, old_cache[0], atol=0, rtol=0)  # same slots written


def test_pure_decode_batch_and_a_single_decode() -> None:
    bs = 4
    chunks, keys, values = scenario(bs, 64)
    decodes = [(c, kk, vv) for c, kk, vv in zip(chunks, keys, values) if c.num_query_tokens == 1 and c.num_computed_tokens]
    for batch in (decodes, decodes[:1]):
        cs = [SequenceChunk(i, 1, c.num_computed_tokens, c.block_ids) for i, (c, _, _) in enumerate(batch)]
        kc = torch.zeros(64, bs, HKV, D)
        vc = torch.zeros_like(kc)
        for c, kk, vv in zip(cs, [b[1] for b in batch], [b[2] for b in batch]):
            for pos in range(c.context_len):
                kc[c.block_ids[pos // bs], pos % bs] = kk[pos]
                vc[c.block_ids[pos // bs], pos % bs] = vv[pos]
        q = torch.randn(len(cs), HQ, D, generator=torch.Generator().manual_seed(2))
        new_k = torch.stack([b[1][-1] for b in batch])
        new_v = torch.stack([b[2][-1] for b in batch])
        backend = FlexPagedBackend(bs, CPU)
        got = backend.forward(q, new_k, new_v, (kc, vc), backend.build_metadata(cs), 0.3)
        expected = reference(q, cs, [b[1] for b in batch], [b[2] for b in batch], 0.3)
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=2e-6)


def test_no_chunk_takes_the_math_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decodes never reach SDPA (the paged kernel reads them); a whole new prompt takes causal
    SDPA, a later chunk or prefix hit SDPA with its causal mask over its own blocks, and all of
    it runs with the math kernel excluded (torch raises when no allowed kernel fits)."""
    bs = 16
    chunks = mixed_batch(bs)
    (kc, vc), q, k, v = filled_cache(chunks, bs, torch.float32)
    calls: list[dict[str, object]] = []
    real = F.scaled_dot_product_attention

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    backend = FlexPagedBackend(bs, CPU)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        backend.forward(q, k, v, (kc, vc), backend.build_metadata(chunks), 0.125)
    fresh = [c for c in chunks if c.num_computed_tokens == 0]
    later = [c for c in chunks if c.num_computed_tokens > 0 and c.num_query_tokens > 1]
    assert len(calls) == len(fresh) + len(later)
    assert sum(bool(c.get("is_causal")) for c in calls) == len(fresh)
    assert sum(c.get("attn_mask") is not None for c in calls) == len(later)


def test_flex_paged_is_chosen_by_name_and_auto_starts_without_compiling() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        assert isinstance(create_attention_backend("flex_paged", block_size=16, device=CPU, dtype=dtype), FlexPagedBackend)
        assert not isinstance(create_attention_backend("auto", block_size=16, device=CPU, dtype=dtype), FlexPagedBackend)


def test_warm_up_compiles_without_touching_the_cache() -> None:
    kc, vc = torch.randn(8, 4, HKV, D), torch.randn(8, 4, HKV, D)
    before = (kc.clone(), vc.clone())
    FlexPagedBackend(4, CPU).warm_up((kc, vc), HQ, 0.3)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_one_compiled_graph_serves_every_batch_shape_after_warm_up() -> None:
    """Rows, table widths, positions and block ids change every step; none of them compiles
    again once the worker has warmed up (a recompile would cost seconds mid-serving)."""
    from torch._dynamo.utils import counters

    bs, nb = 8, 96
    kc, vc = torch.randn(nb, bs, HKV, D), torch.randn(nb, bs, HKV, D)
    backend = FlexPagedBackend(bs, CPU)
    backend.warm_up((kc, vc), HQ, 0.25)
    graphs = counters["stats"]["unique_graphs"]
    rng = random.Random(0)
    with torch.inference_mode():
        for num_seqs, context in [(6, 3), (1, 40), (4, 17), (2, 9)]:
            chunks, start = [], 0
            for i in range(num_seqs):
                n = 1 if i % 2 else rng.randint(1, 6)
                chunks.append(SequenceChunk(start, n, context + i, rng.sample(range(nb), -(-(context + i + n) // bs))))
                start += n
            q, k, v = torch.randn(start, HQ, D), torch.randn(start, HKV, D), torch.randn(start, HKV, D)
            backend.forward(q, k, v, (kc, vc), backend.build_metadata(chunks), 0.25)
    assert counters["stats"]["unique_graphs"] == graphs
