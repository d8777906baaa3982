"""What a worker process sets up before its runner loads (its pipe protocol and restarts are
tested in tests/omni/engines/test_worker_process.py and test_supervisor.py)."""

from __future__ import annotations

import pytest
import torch

from gpu_workers import worker
from omni.shared import protocol


def test_a_gpu_worker_gets_expandable_segments_unless_the_user_chose() -> None:
    env: dict[str, str] = {}
    worker.prepare_environment(protocol.LLMWorkerSpec(model_dir="m", device="cuda:1"), env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "OMP_NUM_THREADS": "4"}
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    worker.prepare_environment(protocol.EncoderWorkerSpec(model_dir="m", device="cuda:0", num_threads=2), env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512", "OMP_NUM_THREADS": "2"}
    env = {}
    worker.prepare_environment(protocol.LLMWorkerSpec(model_dir="m", device="cpu"), env)
    assert env == {}


def test_each_rank_makes_its_own_gpu_current_and_bounds_its_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(d))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    spec = protocol.VisionDecoderWorkerSpec(model_dir="m", device="cuda:2", world_size=2, rank_devices=["cuda:2", "cuda:3"])
    worker.bind_device(spec, 1)
    assert calls == [torch.device("cuda:3"), worker.GPU_WORKER_THREADS]
    calls.clear()
    worker.bind_device(protocol.LLMWorkerSpec(model_dir="m", device="cpu", num_threads=3), 0)
    assert calls == [3]  # the CPU: no device to bind, the threads it was given
    calls.clear()
    worker.bind_device(protocol.LLMWorkerSpec(model_dir="m", device="cpu"), 0)
    assert calls == []
