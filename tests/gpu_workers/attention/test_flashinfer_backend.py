"""The FlashInfer backend on the CPU, its kernel replaced by the contract it implements.

flashinfer-python is CUDA-only and not installed here, so these tests put a fake `flashinfer`
module into sys.modules. Its BatchPrefillWithPagedKVCacheWrapper is generated from FlashInfer
0.7.4's recorded signatures (library_fakes.py): __init__, plan and run accept exactly the
parameters the real ones do, so a keyword FlashInfer lacks fails here as on the GPU. Behind
that, run() computes with paged_varlen_reference from nothing but the CSR page lists plan() was
given (FlashInfer's documented meaning: kv_indptr, kv_indices, last_page_len, bottom-right
causal), and plan() of a kernel named in `failing` raises as FlashInfer does when nvcc fails
(0.7.4 builds a kernel module in plan: get_batch_prefill_module(...).build_and_load()).
The real kernel is compared with the same reference on a GPU (test_backends.py, CUDA only).

Worst difference measured against the dense per-query reference: 4.8e-7 (fp32).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.attention import flashinfer_backend
from gpu_workers.attention.flash_attn_backend import LONG_CHUNK_ROWS
from gpu_workers.attention.flashinfer_backend import FlashInferBackend, KernelUnavailable, jit_modules, kernels_for
from gpu_workers.attention.paged_varlen import PagedVarlenMetadata, paged_varlen_reference
from gpu_workers.attention.registry import auto_backend_name, create_attention_backend
from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from tests.gpu_workers.attention.library_fakes import (
    Signatures,
    fake_class,
    fake_module,
    load_signatures,
    remove_parameter,
    rename_parameter,
)
from tests.gpu_workers.attention.test_backends import CUDA, HEADS, HKV, HQ, D, run_backend
from tests.gpu_workers.attention.test_flex_paged import filled_cache, mixed_batch

CPU = torch.device("cpu")
NVCC_FAILED = "Ninja build failed. ninja: build stopped: subcommand failed."  # what FlashInfer's JIT raises


@dataclass
class FakeFlashInfer:
    """What the fake library saw: each wrapper's kernel, each plan's arguments, the runs."""

    failing: set[str] = field(default_factory=set)  # kernels ("fa3", "fa2") whose build fails
    wrappers: list[str] = field(default_factory=list)  # the backend each wrapper was made for
    plans: list[dict[str, Any]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)  # the kernel of each run


class PrefillWrapperContract:
    """BatchPrefillWithPagedKVCacheWrapper's behaviour in plain torch; its methods take every
    argument by name (library_fakes.fake_class has bound them to the real signature)."""

    library: FakeFlashInfer

    def __init__(self, a: dict[str, Any]) -> None:
        assert a["kv_layout"] == "NHD" and a["float_workspace_buffer"].dtype == torch.uint8
        assert a["use_cuda_graph"] is False
        self.kernel = a["backend"]
        self.library.wrappers.append(self.kernel)
        self.plan_args: dict[str, Any] | None = None

    def plan(self, a: dict[str, Any]) -> None:
        if self.kernel in self.library.failing:
            raise RuntimeError(NVCC_FAILED)
        for name in ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len"):
            t = a[name]
            assert t.device.type == "cpu" and t.dtype == torch.int32  # plan reads them on the host
        assert a["causal"] is True and a["head_dim_vo"] is None  # None: head_dim_qk
        self.plan_args = a
        self.library.plans.append(a)

    def run(self, a: dict[str, Any]) -> torch.Tensor:
        p = self.plan_args
        assert p is not None, "run before plan"
        self.library.runs.append(self.kernel)
        q, (k_cache, v_cache) = a["q"], a["paged_kv_cache"]
        assert k_cache.shape[1:] == (p["page_size"], p["num_kv_heads"], p["head_dim_qk"])  # NHD pages
        assert q.shape[1:] == (p["num_qo_heads"], p["head_dim_qk"]) and q.dtype == p["q_data_type"]
        assert k_cache.dtype == p["kv_data_type"]
        indptr, indices, last = p["paged_kv_indptr"].tolist(), p["paged_kv_indices"].tolist(), p["paged_kv_last_page_len"].tolist()
        pages = [indices[s:e] for s, e in zip(indptr, indptr[1:])]
        width = max(len(x) for x in pages)
        table = torch.tensor([x + [0] * (width - len(x)) for x in pages], dtype=torch.int32)
        lens = torch.tensor([(len(x) - 1) * p["page_size"] + n for x, n in zip(pages, last)], dtype=torch.int32)
        m = PagedVarlenMetadata(q.shape[0], None, p["qo_indptr"], lens, p["qo_indptr"], table, 0, 0, False)
        return paged_varlen_reference(q, k_cache, v_cache, m, p["sm_scale"])


def install_fake_flashinfer(monkeypatch: pytest.MonkeyPatch, sigs: Signatures | None = None,
                            failing: set[str] | None = None) -> FakeFlashInfer:  # fmt: skip
    """A fake `flashinfer` in sys.modules whose prefill wrapper has FlashInfer 0.7.4's signatures
    (or sigs'); returns what it records."""
    library = FakeFlashInfer(failing or set())
    impl = type("PrefillWrapper", (PrefillWrapperContract,), {"library": library})
    wrapper = fake_class(sigs or load_signatures(), "flashinfer", "BatchPrefillWithPagedKVCacheWrapper", impl)
    monkeypatch.setitem(sys.modules, "flashinfer", fake_module("flashinfer", BatchPrefillWithPagedKVCacheWrapper=wrapper))
    return library


@pytest.fixture
def fake_flashinfer(monkeypatch: pytest.MonkeyPatch) -> FakeFlashInfer:
    return install_fake_flashinfer(monkeypatch)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_flashinfer_feeds_its_kernel_the_right_pages(fake_flashinfer: FakeFlashInfer, block_size: int) -> None:
    run_backend(FlashInferBackend(block_size, CPU), "cpu", torch.float32, block_size)
    assert len(fake_flashinfer.plans) == 1 and fake_flashinfer.runs == ["fa2"]


def test_one_plan_per_step_and_one_run_per_layer(fake_flashinfer: FakeFlashInfer) -> None:
    """Three layers of one step: plan once (at the first layer), one run for every layer, each
    a single call for the whole mixed batch (C9); the next step plans again."""
    bs = 16
    chunks = mixed_batch(bs)
    (kc, vc), q, k, v = filled_cache(chunks, bs, torch.float32)
    backend = FlashInferBackend(bs, CPU)
    m = backend.build_metadata(chunks)
    for _ in range(3):
        backend.forward(q, k, v, (kc, vc), m, 0.125)
    assert (len(fake_flashinfer.plans), len(fake_flashinfer.runs)) == (1, 3)
    plan = fake_flashinfer.plans[0]
    assert (plan["num_qo_heads"], plan["num_kv_heads"], plan["head_dim_qk"], plan["page_size"]) == (HQ, HKV, D, bs)
    backend.forward(q, k, v, (kc, vc), backend.build_metadata(chunks), 0.125)
    assert (len(fake_flashinfer.plans), len(fake_flashinfer.runs)) == (2, 4)


def test_warm_up_runs_the_kernel_without_writing_the_cache(fake_flashinfer: FakeFlashInfer) -> None:
    kc, vc = torch.randn(8, 16, HKV, D), torch.randn(8, 16, HKV, D)
    before = (kc.clone(), vc.clone())
    FlashInferBackend(16, CPU).warm_up((kc, vc), HQ, 0.3)
    assert fake_flashinfer.runs == ["fa2"]
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


# --- the calls, bound to FlashInfer 0.7.4's signatures ----------------------------------------


def test_the_recorded_signatures_are_flashinfer_0_7_4s() -> None:
    sigs = load_signatures()["flashinfer"]
    assert sigs["version"] == "0.7.4" and "flashinfer_python-0.7.4" in sigs["source"]
    plan = [p["name"] for p in sigs["functions"]["BatchPrefillWithPagedKVCacheWrapper.plan"]["params"]]
    assert plan[:9] == ["self", "qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len",
                        "num_qo_heads", "num_kv_heads", "head_dim_qk", "page_size"]  # fmt: skip


@pytest.mark.parametrize(("method", "old"), [
    ("plan", "sm_scale"), ("plan", "paged_kv_last_page_len"), ("plan", "head_dim_qk"), ("run", "paged_kv_cache"),
    ("__init__", "backend"), ("__init__", "kv_layout"),
])  # fmt: skip
def test_a_renamed_flashinfer_argument_fails_the_backends_call(monkeypatch: pytest.MonkeyPatch, method: str, old: str) -> None:
    """The same backend and step as above, against a FlashInfer whose parameter `old` is called
    something else: the call is a TypeError naming it, as it would be on the GPU."""
    sigs = rename_parameter(load_signatures(), "flashinfer", f"BatchPrefillWithPagedKVCacheWrapper.{method}", old, old + "_v2")
    install_fake_flashinfer(monkeypatch, sigs)
    with pytest.raises(TypeError, match=old):
        run_backend(FlashInferBackend(16, CPU), "cpu", torch.float32, 16)


def test_a_removed_flashinfer_argument_fails_the_backends_call(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_flashinfer(monkeypatch, remove_parameter(load_signatures(), "flashinfer",
                                                          "BatchPrefillWithPagedKVCacheWrapper.plan", "kv_data_type"))  # fmt: skip
    with pytest.raises(TypeError, match="kv_data_type"):
        run_backend(FlashInferBackend(16, CPU), "cpu", torch.float32, 16)


# --- which kernel: FA3, then FA2, then torch SDPA ---------------------------------------------


def test_prepare_runs_the_short_rows_and_the_long_chunk_on_the_first_kernel_that_builds(
    fake_flashinfer: FakeFlashInfer,
) -> None:
    """Each wrapper is told its kernel (FlashInfer's auto would build FA2 for short steps and FA3
    for long ones); prepare plans both shapes the worker will (the warm-up's decode rows; the
    profile run's long chunk, over the 64 rows where auto switches) on the one kernel it keeps."""
    backend = FlashInferBackend(16, CPU, kernels=("fa3", "fa2"))
    backend.prepare(torch.float32, HEADS)
    assert backend.kernel == "fa3" and fake_flashinfer.wrappers == ["fa3", "fa3"]  # __init__'s, then prepare's
    rows = [int(p["qo_indptr"][1:].sub(p["qo_indptr"][:-1]).max()) for p in fake_flashinfer.plans]
    assert rows == [1, LONG_CHUNK_ROWS] and LONG_CHUNK_ROWS > 64
    assert fake_flashinfer.runs == ["fa3", "fa3"]


def test_an_fa3_build_failure_is_served_by_fa2(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    library = install_fake_flashinfer(monkeypatch, failing={"fa3"})
    backend = FlashInferBackend(16, CPU, kernels=("fa3", "fa2"))
    with caplog.at_level(logging.WARNING):
        backend.prepare(torch.float32, HEADS)
    assert backend.kernel == "fa2" and library.runs == ["fa2", "fa2"]
    assert f"FlashInfer fa3 is unavailable here (RuntimeError: {NVCC_FAILED}); trying the next kernel" in caplog.text
    library.runs.clear()
    run_backend(backend, "cpu", torch.float32, 16)  # and it serves, on FA2
    assert library.runs == ["fa2"]


def test_when_no_flashinfer_kernel_builds_the_worker_serves_with_torch_sdpa(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """FA3 and FA2 both fail to build: create_attention_backend warns and gives torch SDPA,
    whether FlashInfer was named or chosen by auto (the worker starts; no restart loop)."""
    library = install_fake_flashinfer(monkeypatch, failing={"fa3", "fa2"})
    monkeypatch.setattr(FlashInferBackend, "check_contract", classmethod(lambda c, *a: None))  # a CPU "GPU"
    monkeypatch.setattr(flashinfer_backend, "kernels_for", lambda device: ("fa3", "fa2"))
    with pytest.raises(KernelUnavailable, match=f"fa3: RuntimeError: {NVCC_FAILED}; fa2: RuntimeError"):
        FlashInferBackend(16, CPU, kernels=("fa3", "fa2")).prepare(torch.float32, HEADS)
    with caplog.at_level(logging.WARNING):
        backend = create_attention_backend("flashinfer", block_size=16, device=CPU, dtype=torch.float32, heads=HEADS)
    assert type(backend) is TorchSDPABackend and library.runs == []
    assert "attention backend 'flashinfer' cannot run here (KernelUnavailable: no FlashInfer kernel runs here" in caplog.text
    assert "serving with 'torch_sdpa' instead" in caplog.text
    run_backend(backend, "cpu", torch.float32, 16)


def test_flashinfer_is_chosen_by_auto_when_installed_and_takes_any_block_size(fake_flashinfer: FakeFlashInfer) -> None:
    assert FlashInferBackend.importable() is None
    for bs in (1, 16, 24):
        assert auto_backend_name(bs, CUDA, torch.bfloat16, HEADS) == "flashinfer"


def test_an_import_that_fails_with_another_error_is_served_by_the_next_backend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`import flashinfer` raising OSError (a CUDA library it cannot load), not ImportError:
    FlashInfer is not importable, so auto on CUDA takes the next (torch SDPA here), and
    naming it is refused with the reason, not a crash."""
    package = tmp_path / "flashinfer"
    package.mkdir()
    (package / "__init__.py").write_text("raise OSError('libcudart.so.13: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    reason = FlashInferBackend.importable()
    assert reason is not None and reason.startswith("flashinfer-python cannot be imported (OSError: libcudart.so.13")
    assert auto_backend_name(16, CUDA, torch.bfloat16, HEADS) == "torch_sdpa"
    with pytest.raises(ValueError, match="'flashinfer' is not available here: flashinfer-python cannot be imported"):
        create_attention_backend("flashinfer", block_size=16, device=CUDA, dtype=torch.bfloat16, heads=HEADS)


def test_fa3_is_tried_only_on_sm90(monkeypatch: pytest.MonkeyPatch) -> None:
    for capability, kernels in [((9, 0), ("fa3", "fa2")), ((8, 0), ("fa2",)), ((10, 0), ("fa2",)), ((12, 0), ("fa2",))]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        assert kernels_for(CUDA) == kernels
    assert kernels_for(CPU) == ("fa2",)


def test_a_kernel_built_at_start_is_logged_with_its_time(
    fake_flashinfer: FakeFlashInfer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What FlashInfer built into its JIT cache during prepare (a new <name>/<name>.so) is
    logged as built at start, with the seconds; a kernel already cached is only 'ready'."""
    jit_dir = tmp_path / "cached_ops"
    monkeypatch.setitem(sys.modules, "flashinfer.jit", fake_module("flashinfer.jit", env=fake_module("env", FLASHINFER_JIT_DIR=jit_dir)))
    assert jit_modules() == frozenset()
    module = "batch_prefill_with_kv_cache_dtype_q_bf16_head_dim_qk_64_fa2"

    def build(self: FlashInferBackend, dtype: torch.dtype, heads: Any) -> None:
        (jit_dir / module).mkdir(parents=True, exist_ok=True)
        (jit_dir / module / f"{module}.so").write_bytes(b"")

    monkeypatch.setattr(FlashInferBackend, "_exercise", build)
    backend = FlashInferBackend(16, CPU)
    with caplog.at_level(logging.INFO, logger=flashinfer_backend.__name__):
        backend.prepare(torch.bfloat16, HEADS)
        backend.prepare(torch.bfloat16, HEADS)  # a second worker: built already
    built, ready = [r for r in caplog.records if "built 1 kernel module" in r.message], [r for r in caplog.records if "kernels ready in" in r.message]
    assert len(built) == 1 and built[0].levelno == logging.WARNING and module in built[0].message
    assert "at start in " in built[0].message and "`bin/setup gpu` builds them before the server starts" in built[0].message
    assert len(ready) == 1


@pytest.mark.parametrize(("failing", "serves"), [({"fa3"}, "fa2"), ({"fa3", "fa2"}, "torch_sdpa")])
def test_the_worker_starts_and_serves_when_flashinfer_kernels_fail_to_build(
    monkeypatch: pytest.MonkeyPatch, hf_checkpoint: Any, failing: set[str], serves: str
) -> None:
    """The LLM runner as a worker builds it, on FlashInfer (its CUDA-only contract lifted for the
    CPU, FA3 tried first as on sm90) with FA3's build failing, then FA2's too: it starts, warms
    up and decodes token for token as transformers, on FA2, then on torch SDPA."""
    from gpu_workers.llm.runner import LLMRunner
    from tests.gpu_workers.conftest import StepDriver, hf_greedy

    library = install_fake_flashinfer(monkeypatch, failing=failing)
    monkeypatch.setattr(FlashInferBackend, "check_contract", classmethod(lambda c, *a: None))
    monkeypatch.setattr(flashinfer_backend, "kernels_for", lambda device: ("fa3", "fa2"))
    model_dir, hf = hf_checkpoint("qwen2")
    r = LLMRunner(model_dir, device="cpu", dtype=torch.float32, block_size=4, num_kv_blocks=64, attention_backend="flashinfer")
    mc = r.model_config
    r.attention_backend.warm_up(r.kv_caches[0], mc.num_heads, mc.attention_scale)  # as from_spec does
    backend = r.attention_backend
    assert (backend.kernel if isinstance(backend, FlashInferBackend) else backend.name) == serves
    prompts = [[9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 22, 33], list(range(30, 41))]
    assert StepDriver(r, chunk=5).run(prompts, 4, join_at=[0, 1]) == [hf_greedy(hf, p, 4) for p in prompts]
    assert set(library.runs) == ({"fa2"} if serves == "fa2" else set())
