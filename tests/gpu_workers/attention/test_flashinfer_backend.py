"""The FlashInfer backend on the CPU, its kernel replaced by the contract it implements.

flashinfer-python is CUDA-only and not installed here, so these tests put a stub `flashinfer`
module into sys.modules: its BatchPrefillWithPagedKVCacheWrapper records plan() and computes
run() with paged_varlen_reference from nothing but the CSR page lists plan() was given (FlashInfer's
documented meaning: kv_indptr, kv_indices, last_page_len, bottom-right causal). The real kernel
is compared with the same reference on a GPU (test_backends.py, CUDA only).

Worst difference measured against the dense per-query reference: 4.8e-7 (fp32).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from gpu_workers.attention.flashinfer_backend import FlashInferBackend
from gpu_workers.attention.paged_varlen import PagedVarlenMetadata, paged_varlen_reference
from gpu_workers.attention.registry import create_attention_backend
from tests.gpu_workers.attention.test_backends import HEADS, HKV, HQ, D, run_backend
from tests.gpu_workers.attention.test_flex_paged import filled_cache, mixed_batch

CPU = torch.device("cpu")


class StubPrefillWrapper:
    plans: list[dict[str, Any]] = []
    runs = 0

    def __init__(self, workspace: torch.Tensor, kv_layout: str) -> None:
        assert kv_layout == "NHD" and workspace.dtype == torch.uint8
        self.plan_args: dict[str, Any] | None = None

    def plan(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
             last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
             **kw: Any) -> None:  # fmt: skip
        for t in (qo_indptr, kv_indptr, kv_indices, last_page_len):
            assert t.device.type == "cpu" and t.dtype == torch.int32  # plan reads them on the host
        assert kw["causal"] is True
        self.plan_args = dict(qo=qo_indptr, indptr=kv_indptr, indices=kv_indices, last=last_page_len,
                              heads=(num_qo_heads, num_kv_heads, head_dim), page_size=page_size, **kw)  # fmt: skip
        StubPrefillWrapper.plans.append(self.plan_args)

    def run(self, q: torch.Tensor, paged_kv_cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        StubPrefillWrapper.runs += 1
        p = self.plan_args
        assert p is not None
        k_cache, v_cache = paged_kv_cache
        assert k_cache.shape[1:] == (p["page_size"], p["heads"][1], p["heads"][2])  # NHD pages
        assert q.shape[1:] == (p["heads"][0], p["heads"][2]) and q.dtype == p["q_data_type"]
        indptr, indices, last = p["indptr"].tolist(), p["indices"].tolist(), p["last"].tolist()
        pages = [indices[a:b] for a, b in zip(indptr, indptr[1:])]
        width = max(len(x) for x in pages)
        table = torch.tensor([x + [0] * (width - len(x)) for x in pages], dtype=torch.int32)
        lens = torch.tensor([(len(x) - 1) * p["page_size"] + n for x, n in zip(pages, last)], dtype=torch.int32)
        m = PagedVarlenMetadata(q.shape[0], None, p["qo"], lens, p["qo"], table, 0, 0, False)
        return paged_varlen_reference(q, k_cache, v_cache, m, p["sm_scale"])


@pytest.fixture
def stub_flashinfer(monkeypatch: pytest.MonkeyPatch) -> type[StubPrefillWrapper]:
    module = types.ModuleType("flashinfer")
    module.BatchPrefillWithPagedKVCacheWrapper = StubPrefillWrapper  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    StubPrefillWrapper.plans, StubPrefillWrapper.runs = [], 0
    return StubPrefillWrapper


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_flashinfer_feeds_its_kernel_the_right_pages(stub_flashinfer: type[StubPrefillWrapper], block_size: int) -> None:
    run_backend(FlashInferBackend(block_size, CPU), "cpu", torch.float32, block_size)
    assert len(stub_flashinfer.plans) == 1 and stub_flashinfer.runs == 1


def test_one_plan_per_step_and_one_run_per_layer(stub_flashinfer: type[StubPrefillWrapper]) -> None:
    """Three layers of one step: plan once (at the first layer), one run for every layer, each
    a single call for the whole mixed batch (C9); the next step plans again."""
    bs = 16
    chunks = mixed_batch(bs)
    (kc, vc), q, k, v = filled_cache(chunks, bs, torch.float32)
    backend = FlashInferBackend(bs, CPU)
    m = backend.build_metadata(chunks)
    for _ in range(3):
        backend.forward(q, k, v, (kc, vc), m, 0.125)
    assert (len(stub_flashinfer.plans), stub_flashinfer.runs) == (1, 3)
    assert stub_flashinfer.plans[0]["heads"] == (HQ, HKV, D) and stub_flashinfer.plans[0]["page_size"] == bs
    backend.forward(q, k, v, (kc, vc), backend.build_metadata(chunks), 0.125)
    assert (len(stub_flashinfer.plans), stub_flashinfer.runs) == (2, 4)


def test_warm_up_runs_the_kernel_without_writing_the_cache(stub_flashinfer: type[StubPrefillWrapper]) -> None:
    kc, vc = torch.randn(8, 16, HKV, D), torch.randn(8, 16, HKV, D)
    before = (kc.clone(), vc.clone())
    FlashInferBackend(16, CPU).warm_up((kc, vc), HQ, 0.3)
    assert stub_flashinfer.runs == 1
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_flashinfer_is_chosen_when_installed_and_takes_any_block_size(
    stub_flashinfer: type[StubPrefillWrapper], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert FlashInferBackend.importable() is None
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: torch.zeros(1, dtype=torch.uint8))  # no GPU workspace
    for bs in (1, 16, 24):
        backend = create_attention_backend("auto", block_size=bs, device=torch.device("cuda"), dtype=torch.bfloat16,
                                           heads=HEADS)  # fmt: skip
        assert type(backend) is FlashInferBackend
