"""The flash-attn backends (vLLM's build and upstream FA2): on the CPU with the kernel replaced
by its contract in plain torch, and on a GPU against the dense reference when flash-attn is there."""

from __future__ import annotations

import pytest
import torch

from gpu_workers.attention.backend import AttentionBackend, SequenceChunk
from gpu_workers.attention.flash_attn_backend import FlashAttnBackend, VllmFlashAttnBackend
from gpu_workers.attention.registry import create_attention_backend
from tests.gpu_workers.attention.test_backends import CPU, HKV, HQ, D, FakeVarlen, reference, run_backend


@pytest.mark.parametrize(("cls", "block_size"), [(VllmFlashAttnBackend, 4), (VllmFlashAttnBackend, 16), (FlashAttnBackend, 16)])
def test_the_flash_backends_feed_their_kernel_one_call_per_layer(
    monkeypatch: pytest.MonkeyPatch, cls: type[AttentionBackend], block_size: int
) -> None:
    """With the kernel replaced by its contract in plain torch, the backend (metadata, cache
    writes, arguments) gives the dense reference's outputs, in ONE kernel call per layer for
    the whole mixed batch (C9). Worst difference measured: 4.8e-7 (fp32)."""
    fake = FakeVarlen()
    monkeypatch.setattr(cls, "_import", classmethod(lambda c: fake))
    run_backend(cls(block_size, CPU), "cpu", torch.float32, block_size)
    assert len(fake.calls) == 1
    assert ("seqused_k" in fake.calls[0]) == (cls is VllmFlashAttnBackend)


def test_the_flash_backends_run_a_stateless_forward_as_plain_varlen(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeVarlen()
    monkeypatch.setattr(VllmFlashAttnBackend, "_import", classmethod(lambda c: fake))
    backend = VllmFlashAttnBackend(16, CPU)
    chunks = [SequenceChunk(0, 5, 0, []), SequenceChunk(5, 3, 0, [])]
    gen = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(8, HQ, D, generator=gen), torch.randn(8, HKV, D, generator=gen), torch.randn(8, HKV, D, generator=gen)
    got = backend.forward(q, k, v, None, backend.build_metadata(chunks), 0.3)
    expected = reference(q, chunks, [k[:5], k[5:]], [v[:5], v[5:]], 0.3)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(fake.calls) == 1 and "block_table" not in fake.calls[0]


@pytest.mark.cuda  # bench/gpu_smoke.sh selects the CUDA tests with -m cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flash_attn_matches_reference() -> None:
    pytest.importorskip("flash_attn")
    backend = create_attention_backend("flash_attn", block_size=256, device=torch.device("cuda"), dtype=torch.bfloat16)
    run_backend(backend, "cuda", torch.bfloat16, 256)

