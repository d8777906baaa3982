"""The order workers start in, so that the memory budgets of a GPU add up (review A4, A7).

    1. every worker that does not size itself from free memory (encoders, decoders), together:
       each runs its largest batch before it says ready and keeps that peak reserved
    2. the LLM workers, one after another on each GPU (GPUs side by side): each sizes its KV
       cache from what is left, told how many of that GPU's LLM workers (itself included) are
       still to size theirs, so that each takes an equal share (gpu_workers/llm/memory.py)

Two workers sizing at once would each count the device's free memory before the other took
any. On the CPU nothing is sized from free memory: CPU workers start together.

A worker restarted later is told it is the last (memory_shares 1): the others hold theirs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Sequence
from typing import Protocol

from omni.shared import protocol


class Startable(Protocol):
    spec: protocol.WorkerSpec
    sizes_from_free_memory: bool

    def use_spec(self, spec: protocol.WorkerSpec) -> None: ...

    def start(self) -> Awaitable[None]: ...


def sizing_turns(workers: Sequence[Startable]) -> list[list[Startable]]:
    """The workers that size from free memory, in turns: each GPU's in a list of its own (in
    the order given), every CPU worker in a list of one."""
    by_gpu: dict[str, list[Startable]] = {}
    turns: list[list[Startable]] = []
    for worker in workers:
        if not worker.sizes_from_free_memory:
            continue
        if worker.spec.device == "cpu":
            turns.append([worker])
        else:
            by_gpu.setdefault(worker.spec.device, []).append(worker)
    return list(by_gpu.values()) + turns


async def start_in_order(workers: Sequence[Startable], *also: Awaitable[object]) -> None:
    """Start every worker as the module says; `also` runs beside the first wave."""
    await asyncio.gather(*(w.start() for w in workers if not w.sizes_from_free_memory), *also)
    await asyncio.gather(*(_one_after_another(turn) for turn in sizing_turns(workers)))


async def _one_after_another(workers: list[Startable]) -> None:
    for i, worker in enumerate(workers):
        if isinstance(worker.spec, protocol.LLMWorkerSpec):
            worker.use_spec(dataclasses.replace(worker.spec, memory_shares=len(workers) - i))
        try:
            await worker.start()
        finally:
            if isinstance(worker.spec, protocol.LLMWorkerSpec):
                worker.use_spec(dataclasses.replace(worker.spec, memory_shares=1))
