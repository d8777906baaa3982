"""The paged varlen metadata the CUDA kernels are fed, against the torch SDPA path's indices, and
the kernels' contract computed in plain torch (paged_varlen_reference) against TorchSDPABackend.

Worst differences measured (CPU, torch 2.13): the reference against TorchSDPABackend on the
mixed batch (decodes, a new prompt, a later chunk, prefix hits), 3.6e-7 in fp32 at block sizes
1, 4 and 16; 7.8e-3 (one bf16 step near 1) with bf16 caches and queries.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpu_workers.attention.backend import SequenceChunk, slot_mapping, write_kv
from gpu_workers.attention.paged_varlen import build_paged_varlen, flashinfer_pages, paged_varlen_reference
from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from tests.gpu_workers.attention.test_flex_paged import filled_cache, mixed_batch, sdpa_visible_slots

CPU = torch.device("cpu")


def kernel_visible_slots(chunks: list[SequenceChunk], block_size: int) -> dict[int, list[int]]:
    """The slots each packed row sees, read from the varlen metadata alone: chunk b's rows
    cu_q[b]..cu_q[b+1], its context seqused_k[b] through block_table[b], causal bottom-right."""
    m = build_paged_varlen(chunks, block_size, CPU)
    cu, lens = m.cu_seqlens_q.tolist(), m.seqused_k.tolist()
    seen = {}
    for b, ctx in enumerate(lens):
        n = cu[b + 1] - cu[b]
        slots = (m.block_table[b, :, None] * block_size + torch.arange(block_size)).flatten()[:ctx].tolist()
        for i in range(n):
            seen[cu[b] + i] = slots[: ctx - n + i + 1]
    return seen


def csr_visible_slots(chunks: list[SequenceChunk], block_size: int) -> dict[int, list[int]]:
    """The same, read from FlashInfer's CSR page lists."""
    m = build_paged_varlen(chunks, block_size, CPU)
    indptr, indices, last = (t.tolist() for t in flashinfer_pages(m, block_size))
    cu = m.cu_seqlens_q.tolist()
    seen = {}
    for b in range(len(indptr) - 1):
        pages = indices[indptr[b] : indptr[b + 1]]
        assert 1 <= last[b] <= block_size
        ctx = (len(pages) - 1) * block_size + last[b]
        slots = [p * block_size + o for p in pages for o in range(block_size)][:ctx]
        n = cu[b + 1] - cu[b]
        for i in range(n):
            seen[cu[b] + i] = slots[: ctx - n + i + 1]
    return seen


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_metadata_matches_the_sdpa_paths_indices(block_size: int) -> None:
    """Mixed prefill, decode and prefix-hit rows: the same chunks, rows, context lengths, slots
    seen and slots written as the SDPA path's decode table, prefill blocks and masks."""
    chunks = mixed_batch(block_size)
    m = build_paged_varlen(chunks, block_size, CPU)
    sdpa = TorchSDPABackend(block_size, CPU).build_metadata(chunks)
    # one varlen entry per chunk: the SDPA path's decode rows and prefill spans
    spans = [(p.start, p.end) for p in sdpa.prefills]
    assert sdpa.decode is not None
    spans += [(r, r + 1) for r in sdpa.decode.rows.tolist()]
    cu = m.cu_seqlens_q.tolist()
    assert sorted(spans) == list(zip(cu, cu[1:]))
    lens = dict(zip(cu, m.seqused_k.tolist()))
    assert all(lens[p.start] == p.context_len for p in sdpa.prefills)
    assert [lens[r] for r in sdpa.decode.rows.tolist()] == sdpa.decode.context_lens.tolist()
    assert m.cu_seqlens_k.tolist() == [0, *torch.tensor(m.seqused_k.tolist()).cumsum(0).tolist()]
    assert (m.max_seqlen_q, m.max_seqlen_k) == (max(c.num_query_tokens for c in chunks), max(lens.values()))
    # every continuing row sees the slots the SDPA path lets it see; the new prompt's rows their own
    continuing = sorted(
        set(sdpa.decode.rows.tolist()) | {r for p in sdpa.prefills if p.block_ids is not None for r in range(p.start, p.end)}
    )
    expected = dict(zip(continuing, sdpa_visible_slots(chunks, block_size)))
    seen, csr = kernel_visible_slots(chunks, block_size), csr_visible_slots(chunks, block_size)
    assert {r: seen[r] for r in continuing} == expected == {r: csr[r] for r in continuing}
    assert seen == csr
    assert m.slots is not None and m.slots.tolist() == slot_mapping(chunks, block_size)
    assert sdpa.slots is not None and torch.equal(m.slots, sdpa.slots)


def test_metadata_is_one_int32_buffer_and_rejects_gaps() -> None:
    chunks = mixed_batch(4)
    m = build_paged_varlen(chunks, 4, CPU)
    for t in (m.cu_seqlens_q, m.seqused_k, m.cu_seqlens_k, m.block_table):
        assert t.dtype == torch.int32 and t.untyped_storage().data_ptr() == m.cu_seqlens_q.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match="contiguous"):
        build_paged_varlen([SequenceChunk(0, 2, 0, [1]), SequenceChunk(3, 1, 4, [2, 3])], 4, CPU)
    with pytest.raises(ValueError, match="blocks"):
        build_paged_varlen([SequenceChunk(0, 2, 3, [1])], 4, CPU)


@pytest.mark.parametrize(("block_size", "dtype", "tol"),
                         [(1, torch.float32, 1e-6), (4, torch.float32, 1e-6), (16, torch.float32, 1e-6),
                          (16, torch.bfloat16, 1.6e-2)])  # fmt: skip
def test_the_kernel_contract_computes_what_torch_sdpa_does(block_size: int, dtype: torch.dtype, tol: float) -> None:
    """paged_varlen_reference reads the cache through the metadata alone; TorchSDPABackend
    through its own gathers and masks. Same cache, same step, same outputs."""
    chunks = mixed_batch(block_size)
    (kc, vc), q, k, v = filled_cache(chunks, block_size, dtype)
    sdpa = TorchSDPABackend(block_size, CPU)
    expected = sdpa.forward(q, k, v, (kc.clone(), vc.clone()), sdpa.build_metadata(chunks), 0.125)
    m = build_paged_varlen(chunks, block_size, CPU)
    write_kv(k, v, (kc, vc), m.slots)
    got = paged_varlen_reference(q, kc, vc, m, 0.125)
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("name", ["vllm_flash_attn", "flashinfer"])
def test_the_runner_through_a_paged_kernel_matches_generate(
    name: str, hf_checkpoint: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole LLM runner on a paged CUDA backend, its kernel replaced by the contract in
    plain torch (and its CUDA-only contract check lifted for the CPU): prefix-cache hits,
    prompts prefilled in 5-token chunks next to decodes, token for token as transformers."""
    from gpu_workers.attention.flash_attn_backend import VllmFlashAttnBackend
    from gpu_workers.attention.flashinfer_backend import FlashInferBackend
    from gpu_workers.llm.runner import LLMRunner
    from tests.gpu_workers.attention.test_backends import fake_varlen
    from tests.gpu_workers.attention.test_flashinfer_backend import install_fake_flashinfer
    from tests.gpu_workers.conftest import StepDriver, hf_greedy

    cls = VllmFlashAttnBackend if name == "vllm_flash_attn" else FlashInferBackend
    monkeypatch.setattr(cls, "check_contract", classmethod(lambda c, *a: None))
    if cls is VllmFlashAttnBackend:
        fake, _ = fake_varlen("vllm_flash_attn")
        monkeypatch.setattr(cls, "importable", classmethod(lambda c: None))
        monkeypatch.setattr(cls, "_import", classmethod(lambda c: fake))
    else:
        install_fake_flashinfer(monkeypatch)
    model_dir, hf = hf_checkpoint("qwen2")
    prefix = [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 22, 33]
    prompts = [prefix + [40], prefix[:8] + [50, 60], prefix + [70, 80, 90, 100, 110], list(range(30, 47))]
    expected = [hf_greedy(hf, p, 6) for p in prompts]
    r = LLMRunner(model_dir, device="cpu", dtype=torch.float32, block_size=4, num_kv_blocks=64, attention_backend=name)
    assert type(r.attention_backend) is cls
    assert StepDriver(r, chunk=5).run(prompts, 6, join_at=[0, 2, 3, 3]) == expected
