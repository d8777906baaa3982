"""Two models, two workers each: routing by body model, prefix-aware placement, a worker down."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from tests.e2e.conftest import read_metric
from tests.e2e.server import PROCESSES, running_server, wait_exited, worker_pids


@pytest.fixture(scope="module")
def pool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("pools")
    a = make_tiny_checkpoint(root / "a", "hyperclovax", seed=1)
    b = make_tiny_checkpoint(root / "b", "llama", seed=2)
    with running_server(
        "--model", f"alpha={a}", "--model", f"beta={b}", "--llm-workers", "2",
        "--block-size", "4", "--num-kv-blocks", "256", "--max-model-len", "512",
    ) as base:  # fmt: skip
        yield base


def chat(base: str, model: str, content: str, system: str | None = None, max_tokens: int = 4) -> httpx.Response:
    messages = [{"role": "user", "content": content}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)


def test_body_model_picks_the_pool(pool_server: str) -> None:
    models = httpx.get(f"{pool_server}/v1/models", timeout=120).json()["data"]
    assert sorted(m["id"] for m in models) == ["alpha", "beta"]
    before = {m: read_metric(pool_server, "vllm:request_success_total", model_name=m) for m in ("alpha", "beta")}
    out_a = chat(pool_server, "alpha", "Same question", max_tokens=12).json()
    out_b = chat(pool_server, "beta", "Same question", max_tokens=12).json()
    assert out_a["model"] == "alpha" and out_b["model"] == "beta"
    # Different random weights answer differently; each pool served its own request.
    assert out_a["choices"][0]["message"]["content"] != out_b["choices"][0]["message"]["content"]
    assert read_metric(pool_server, "vllm:request_success_total", model_name="alpha") == before["alpha"] + 1
    assert read_metric(pool_server, "vllm:request_success_total", model_name="beta") == before["beta"] + 1
    missing = chat(pool_server, "gamma", "hi")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def test_shared_prefix_sticks_to_the_worker_that_has_it(pool_server: str) -> None:
    system = "You are the assistant of a very long and detailed system prompt. " * 6
    first = chat(pool_server, "alpha", "Question zero?", system)
    assert first.status_code == 200
    prefix_before = read_metric(pool_server, "omni_placement_decisions_total", model_name="alpha", reason="prefix")
    cached = []
    for i in range(1, 7):
        out = chat(pool_server, "alpha", f"Question {i}?", system).json()
        cached.append(out["usage"]["prompt_tokens_details"]["cached_tokens"])
    prefix_after = read_metric(pool_server, "omni_placement_decisions_total", model_name="alpha", reason="prefix")
    assert prefix_after - prefix_before == 6
    assert min(cached) >= 64  # the system prompt's blocks, every time


def test_requests_avoid_a_dead_worker(pool_server: str) -> None:
    pids = worker_pids(PROCESSES[pool_server].pid)
    assert len(pids) == 4  # two models x two workers
    os.kill(pids[0], signal.SIGKILL)
    wait_exited(pids[0])  # gone for the server too: it is placed no more work
    # Whichever pool lost a worker keeps serving on the other one while it restarts.
    for i in range(6):
        for model in ("alpha", "beta"):
            r = chat(pool_server, model, f"still there {i}?")
            assert r.status_code == 200, r.text
    deadline = time.monotonic() + 120
    while httpx.get(f"{pool_server}/health", timeout=120).status_code != 200:
        assert time.monotonic() < deadline, "the dead worker was not restarted"
        time.sleep(0.2)
    assert len(worker_pids(PROCESSES[pool_server].pid)) == 4
