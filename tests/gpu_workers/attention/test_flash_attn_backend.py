"""The flash-attn backends (vLLM's build and upstream FA2): on the CPU with the kernel replaced
by its contract in plain torch behind the library's recorded signature (test_backends.fake_varlen:
flash-attn 2.8.3's sdist, vLLM's vllm_flash_attn at the commit library_signatures.json names),
and on a GPU against the dense reference when flash-attn is there."""

from __future__ import annotations

import logging

import pytest
import torch

from gpu_workers.attention.backend import AttentionBackend, SequenceChunk
from gpu_workers.attention.flash_attn_backend import FlashAttnBackend, VllmFlashAttnBackend
from gpu_workers.attention.registry import create_attention_backend
from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from tests.gpu_workers.attention.library_fakes import load_signatures, remove_parameter, rename_parameter
from tests.gpu_workers.attention.test_backends import CPU, HEADS, HKV, HQ, D, fake_varlen, reference, run_backend

LIBRARY = {VllmFlashAttnBackend: "vllm_flash_attn", FlashAttnBackend: "flash_attn"}


@pytest.mark.parametrize(("cls", "block_size"), [(VllmFlashAttnBackend, 4), (VllmFlashAttnBackend, 16), (FlashAttnBackend, 16)])
def test_the_flash_backends_feed_their_kernel_one_call_per_layer(
    monkeypatch: pytest.MonkeyPatch, cls: type[AttentionBackend], block_size: int
) -> None:
    """With the kernel replaced by its contract in plain torch, the backend (metadata, cache
    writes, arguments) gives the dense reference's outputs, in ONE kernel call per layer for
    the whole mixed batch (C9). Worst difference measured: 4.8e-7 (fp32)."""
    fake, calls = fake_varlen(LIBRARY[cls])
    monkeypatch.setattr(cls, "_import", classmethod(lambda c: fake))
    run_backend(cls(block_size, CPU), "cpu", torch.float32, block_size)
    assert len(calls) == 1
    assert (calls[0].get("seqused_k") is not None) == (cls is VllmFlashAttnBackend)


def test_the_flash_backends_run_a_stateless_forward_as_plain_varlen(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, calls = fake_varlen("vllm_flash_attn")
    monkeypatch.setattr(VllmFlashAttnBackend, "_import", classmethod(lambda c: fake))
    backend = VllmFlashAttnBackend(16, CPU)
    chunks = [SequenceChunk(0, 5, 0, []), SequenceChunk(5, 3, 0, [])]
    gen = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(8, HQ, D, generator=gen), torch.randn(8, HKV, D, generator=gen), torch.randn(8, HKV, D, generator=gen)
    got = backend.forward(q, k, v, None, backend.build_metadata(chunks), 0.3)
    expected = reference(q, chunks, [k[:5], k[5:]], [v[:5], v[5:]], 0.3)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(calls) == 1 and calls[0]["block_table"] is None


@pytest.mark.parametrize(("cls", "old"), [
    (VllmFlashAttnBackend, "seqused_k"), (VllmFlashAttnBackend, "block_table"), (VllmFlashAttnBackend, "softmax_scale"),
    (FlashAttnBackend, "cu_seqlens_k"), (FlashAttnBackend, "block_table"), (FlashAttnBackend, "max_seqlen_k"),
])  # fmt: skip
def test_a_renamed_varlen_argument_fails_the_backends_call(
    monkeypatch: pytest.MonkeyPatch, cls: type[AttentionBackend], old: str
) -> None:
    """The library's parameter `old` called something else (as a new release might): the
    backend's call is a TypeError naming it, on the CPU."""
    sigs = rename_parameter(load_signatures(), LIBRARY[cls], "flash_attn_varlen_func", old, old + "_v2")
    fake, _ = fake_varlen(LIBRARY[cls], sigs)
    monkeypatch.setattr(cls, "_import", classmethod(lambda c: fake))
    with pytest.raises(TypeError, match=old):
        run_backend(cls(16, CPU), "cpu", torch.float32, 16)


def test_a_removed_varlen_argument_fails_the_backends_call(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, _ = fake_varlen("flash_attn", remove_parameter(load_signatures(), "flash_attn", "flash_attn_varlen_func", "causal"))
    monkeypatch.setattr(FlashAttnBackend, "_import", classmethod(lambda c: fake))
    with pytest.raises(TypeError, match="causal"):
        run_backend(FlashAttnBackend(16, CPU), "cpu", torch.float32, 16)


@pytest.mark.parametrize("cls", [VllmFlashAttnBackend, FlashAttnBackend])
def test_a_kernel_that_fails_its_first_run_is_served_by_torch_sdpa(
    monkeypatch: pytest.MonkeyPatch, cls: type[AttentionBackend], caplog: pytest.LogCaptureFixture
) -> None:
    """prepare() runs the kernel on a scratch cache before the model loads; a kernel that
    raises there (a CUDA extension built for another torch, a missing symbol) leaves the worker
    on torch SDPA with a warning."""

    def broken(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")

    monkeypatch.setattr(cls, "_import", classmethod(lambda c: broken))
    monkeypatch.setattr(cls, "check_contract", classmethod(lambda c, *a: None))
    with caplog.at_level(logging.WARNING):
        backend = create_attention_backend(cls.name, block_size=16, device=CPU, dtype=torch.float32, heads=HEADS)
    assert type(backend) is TorchSDPABackend
    assert f"attention backend {cls.name!r} cannot run here (RuntimeError: CUDA error: no kernel image" in caplog.text


def test_an_import_that_fails_with_another_error_makes_the_kernel_unselectable(monkeypatch: pytest.MonkeyPatch) -> None:
    def oserror() -> None:
        raise OSError("libcudart.so.12: cannot open shared object file")

    monkeypatch.setattr(VllmFlashAttnBackend, "_import", classmethod(lambda c: oserror()))
    reason = VllmFlashAttnBackend.importable()
    assert reason is not None and "(OSError: libcudart.so.12" in reason


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flash_attn_matches_reference() -> None:
    pytest.importorskip("flash_attn")
    backend = create_attention_backend("flash_attn", block_size=256, device=torch.device("cuda"), dtype=torch.bfloat16)
    run_backend(backend, "cuda", torch.bfloat16, 256)

