"""`bin/setup gpu`'s kernel builds on the CPU, FlashInfer replaced by fakes bound to 0.7.4's
signatures (library_fakes.py) that "build" a module into a fake JIT cache at their first plan, as
FlashInfer's plan() does (get_batch_prefill_module / get_batch_decode_module: build_and_load).
What only a GPU can show (nvcc really building FA2 and FA3; the time it takes) is the smoke
run's: `python -m gpu_workers.attention.flashinfer_build --head-dims 64`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.attention import flashinfer_backend, flashinfer_build
from gpu_workers.attention.backend import HeadShape
from gpu_workers.attention.flashinfer_build import KernelBuild, build_all, head_shapes, main
from gpu_workers.attention.paged_varlen import PagedVarlenMetadata, paged_varlen_reference
from tests.gpu_workers.attention.library_fakes import fake_class, fake_module, load_signatures, rename_parameter
from tests.gpu_workers.attention.test_flashinfer_backend import NVCC_FAILED, install_fake_flashinfer

CPU = torch.device("cpu")
HEADS = HeadShape(8, 2, 64)


class DecodeWrapperContract:
    """BatchDecodeWithPagedKVCacheWrapper in plain torch: one query row per request over its pages."""

    jit_dir: Path
    runs: list[torch.Tensor]

    def __init__(self, a: dict[str, Any]) -> None:
        assert a["kv_layout"] == "NHD" and a["float_workspace_buffer"].dtype == torch.uint8

    def plan(self, a: dict[str, Any]) -> None:
        for name in ("indptr", "indices", "last_page_len"):
            assert a[name].dtype == torch.int32
        module = f"batch_decode_head_dim_{a['head_dim']}"
        (self.jit_dir / module).mkdir(parents=True, exist_ok=True)
        (self.jit_dir / module / f"{module}.so").touch()
        self.p = a

    def run(self, a: dict[str, Any]) -> torch.Tensor:
        p, q, (kc, vc) = self.p, a["q"], a["paged_kv_cache"]
        assert q.shape == (p["indptr"].numel() - 1, p["num_qo_heads"], p["head_dim"])
        indptr, indices = p["indptr"].tolist(), p["indices"].tolist()
        pages = [indices[s:e] for s, e in zip(indptr, indptr[1:])]
        lens = [(len(x) - 1) * p["page_size"] + n for x, n in zip(pages, p["last_page_len"].tolist())]
        one = torch.arange(len(pages) + 1, dtype=torch.int32)
        m = PagedVarlenMetadata(len(pages), None, one, torch.tensor(lens, dtype=torch.int32), one,
                                torch.tensor(pages, dtype=torch.int32), 1, max(lens), False)  # fmt: skip
        out = paged_varlen_reference(q, kc, vc, m, p["sm_scale"])
        self.runs.append(out)
        return out


@pytest.fixture
def jit_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """FlashInfer's JIT cache, where flashinfer_backend.jit_modules looks."""
    path = tmp_path / "cached_ops"
    monkeypatch.setitem(sys.modules, "flashinfer.jit", fake_module("flashinfer.jit", env=fake_module("env", FLASHINFER_JIT_DIR=path)))
    return path


def fake_library(monkeypatch: pytest.MonkeyPatch, jit_dir: Path, failing: set[str], sigs: Any = None) -> list[torch.Tensor]:
    """The fake prefill wrapper (test_flashinfer_backend's) whose plan also writes its module
    into the JIT cache, and the decode wrapper above; returns the decode runs' outputs."""
    sigs = sigs or load_signatures()
    library = install_fake_flashinfer(monkeypatch, sigs, failing)
    prefill = sys.modules["flashinfer"].BatchPrefillWithPagedKVCacheWrapper
    real_plan = prefill.plan

    def plan(self: Any, *args: Any, **kwargs: Any) -> None:
        real_plan(self, *args, **kwargs)  # bound and checked; raises for a failing kernel
        module = f"batch_prefill_{self.kernel}_head_dim_{library.plans[-1]['head_dim_qk']}"
        (jit_dir / module).mkdir(parents=True, exist_ok=True)
        (jit_dir / module / f"{module}.so").touch()

    monkeypatch.setattr(prefill, "plan", plan)
    runs: list[torch.Tensor] = []
    impl = type("DecodeWrapper", (DecodeWrapperContract,), {"jit_dir": jit_dir, "runs": runs})
    sys.modules["flashinfer"].BatchDecodeWithPagedKVCacheWrapper = fake_class(
        sigs, "flashinfer", "BatchDecodeWithPagedKVCacheWrapper", impl
    )
    monkeypatch.setattr(flashinfer_build, "kernels_for", lambda device: ("fa3", "fa2"))  # as on sm90
    return runs


def test_every_kernel_is_built_once_and_timed_and_a_failed_one_is_reported(
    monkeypatch: pytest.MonkeyPatch, jit_dir: Path
) -> None:
    """FA3 fails to build, FA2 and the decode kernel build: each line says which, with its time;
    run again, everything is cached already."""
    fake_library(monkeypatch, jit_dir, failing={"fa3"})
    lines: list[str] = []
    builds = build_all(CPU, [HEADS], torch.float32, 16, report=lines.append)
    assert [(b.kernel, b.built, b.error is None) for b in builds] == [
        ("prefill fa3", (), False),
        ("prefill fa2", ("batch_prefill_fa2_head_dim_64",), True),
        ("decode", ("batch_decode_head_dim_64",), True),
    ]
    assert NVCC_FAILED in lines[0] and lines[0].startswith("prefill fa3  head_dim 64  float32: FAILED after ")
    assert lines[1].startswith("prefill fa2  head_dim 64  float32: built 1 module(s) in ")
    again = build_all(CPU, [HEADS], torch.float32, 16, report=lines.append)
    assert [b.built for b in again] == [(), (), ()] and "cached already" in lines[-1]


def test_the_decode_kernels_call_is_bound_to_flashinfers_signature_and_computes_the_contract(
    monkeypatch: pytest.MonkeyPatch, jit_dir: Path
) -> None:
    runs = fake_library(monkeypatch, jit_dir, failing=set())
    assert flashinfer_build.build_decode(CPU, HEADS, torch.float32, 16).error is None
    assert len(runs) == 1 and runs[0].shape == (2, 8, 64)
    sigs = rename_parameter(load_signatures(), "flashinfer", "BatchDecodeWithPagedKVCacheWrapper.plan", "last_page_len", "kv_last_page_len")
    fake_library(monkeypatch, jit_dir, failing=set(), sigs=sigs)
    build = flashinfer_build.build_decode(CPU, HEADS, torch.float32, 16)
    assert build.error is not None and build.error.startswith("TypeError") and "last_page_len" in build.error


def test_head_sizes_come_from_the_models_and_one_flashinfer_cannot_take_is_named(
    hf_checkpoint: Any, tmp_path: Path
) -> None:
    tiny, _ = hf_checkpoint("qwen2")  # head_dim 16
    wide = tmp_path / "wide"
    shutil.copytree(tiny, wide)
    config = json.loads((wide / "config.json").read_text())
    config.update(hidden_size=12 * 64, num_attention_heads=12, num_key_value_heads=4, head_dim=64)
    (wide / "config.json").write_text(json.dumps(config))
    shapes, skipped = head_shapes([tiny, wide], [128])
    assert shapes == [HeadShape(12, 4, 64), HeadShape(8, 2, 128)]
    assert skipped == [f"{tiny}: head_dim 16 (FlashInfer's kernels take 64, 128, 256)"]


def test_without_a_gpu_it_says_so_and_fails(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([]) == 1
    assert "no CUDA device; nothing to build" in capsys.readouterr().err


def test_a_build_that_added_nothing_is_cached_already() -> None:
    b = KernelBuild("prefill fa2", 128, torch.bfloat16, 0.25, ())
    assert b.describe() == "prefill fa2  head_dim 128 bfloat16: cached already (0.25 s)"


def test_the_backend_and_the_build_look_in_the_same_cache(jit_dir: Path) -> None:
    (jit_dir / "m").mkdir(parents=True)
    (jit_dir / "m" / "m.so").touch()
    (jit_dir / "m" / "other.so").touch()  # not a module's library: <name>/<name>.so only
    assert flashinfer_backend.jit_modules() == {"m"}
