"""Workers sharing a GPU start so their memory adds up: encoders and decoders first, then each
GPU's LLM workers one after another, each told how many (itself included) are still to size
their KV cache there; a later restart is told it is the last."""

from __future__ import annotations

import asyncio
import dataclasses

from omni.engines.start_order import sizing_turns, start_in_order
from omni.shared import protocol


class FakeWorker:
    def __init__(self, log: list[str], name: str, spec: protocol.WorkerSpec, sizes: bool) -> None:
        self.log, self.name, self.spec, self.sizes_from_free_memory = log, name, spec, sizes
        self.started_with: list[int] = []

    def use_spec(self, spec: protocol.WorkerSpec) -> None:
        self.spec = spec

    async def start(self) -> None:
        self.log.append(f"{self.name} starts")
        if isinstance(self.spec, protocol.LLMWorkerSpec):
            self.started_with.append(self.spec.memory_shares)
        await asyncio.sleep(0.01)  # another worker starting now would show between these
        self.log.append(f"{self.name} up")


def _llm(log: list[str], name: str, device: str) -> FakeWorker:
    return FakeWorker(log, name, protocol.LLMWorkerSpec(model_dir="m", device=device), True)


def test_gpu_sharers_start_in_turn_after_the_encoders_and_split_the_device() -> None:
    log: list[str] = []
    encoder = FakeWorker(log, "encoder", protocol.EncoderWorkerSpec(model_dir="m", device="cuda:0"), False)
    # two models' workers: a (2 on cuda:0, 1 on cuda:1), b (1 on cuda:0)
    a0, a1, a2 = _llm(log, "a0", "cuda:0"), _llm(log, "a1", "cuda:1"), _llm(log, "a2", "cuda:0")
    b0 = _llm(log, "b0", "cuda:0")
    cpu0, cpu1 = _llm(log, "c0", "cpu"), _llm(log, "c1", "cpu")
    workers = [encoder, a0, a1, a2, b0, cpu0, cpu1]
    assert [[w.name for w in turn] for turn in sizing_turns(workers)] == [["a0", "a2", "b0"], ["a1"], ["c0"], ["c1"]]
    asyncio.run(start_in_order(workers))
    assert log[:2] == ["encoder starts", "encoder up"]
    on_gpu0 = [line for line in log if line[:2] in ("a0", "a2", "b0")]
    assert on_gpu0 == ["a0 starts", "a0 up", "a2 starts", "a2 up", "b0 starts", "b0 up"]
    # cuda:1 and the CPU workers did not wait for cuda:0's turn
    assert log.index("a1 starts") < log.index("a0 up") and log.index("c1 starts") < log.index("c0 up")
    assert (a0.started_with, a2.started_with, b0.started_with, a1.started_with) == ([3], [2], [1], [1])
    # once up, a restart of any of them is the last to size
    assert all(isinstance(w.spec, protocol.LLMWorkerSpec) and w.spec.memory_shares == 1 for w in workers[1:])


def test_the_spec_a_worker_is_started_with_crosses_the_pipe() -> None:
    spec = dataclasses.replace(protocol.LLMWorkerSpec(model_dir="m"), memory_shares=3, profile_tokens=8192)
    assert protocol.decode(protocol.encode(spec)) == spec
