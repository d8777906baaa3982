"""A worker kind for tests only: a torch.distributed group whose job is a collective.

Imported in the worker processes through `main`, the spawn target the test names: importing
this module registers the messages and the runner there, as a real kind's module would.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import ClassVar

import torch
import torch.distributed as dist

from gpu_workers.distributed import GroupMember
from gpu_workers.runner import Runner, register_runner
from gpu_workers.worker import worker_main
from omni.shared.protocol import WorkerSpec, message


@message
@dataclass(slots=True)
class ProbeReady:
    TAG: ClassVar[int] = 903
    worker_id: int
    world_size: int


@message
@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeSpec(WorkerSpec):
    TAG: ClassVar[int] = 900
    READY: ClassVar[type] = ProbeReady
    LABEL: ClassVar[str] = "probe worker"


@message
@dataclass(slots=True)
class Probe:
    TAG: ClassVar[int] = 901
    job_id: int
    value: int


@message
@dataclass(slots=True)
class ProbeResult:
    TAG: ClassVar[int] = 902
    job_id: int
    total: int  # value * (1 + 2 + ... + world_size): every rank took part


# What a Probe of a negative value raises, as torch would on a GPU.
FAILURES: dict[int, Exception] = {
    -1: RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported"),
    -2: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    -3: IndexError("index 1000000000 is out of bounds for dimension 1 with size 64"),
}


@register_runner
class ProbeRunner(Runner):
    SPEC = ProbeSpec
    JOB = Probe

    def __init__(self, group: GroupMember) -> None:
        self.group = group

    @classmethod
    def from_spec(cls, spec: ProbeSpec, group: GroupMember) -> ProbeRunner:
        return cls(group)

    def ready_message(self, spec: ProbeSpec) -> ProbeReady:
        return ProbeReady(spec.worker_id, dist.get_world_size() if dist.is_initialized() else 1)

    def _collective(self, value: torch.Tensor) -> int:
        if dist.is_initialized():
            dist.broadcast(value, src=0)  # rank 0's job reaches every rank
        mine = value * (self.group.rank + 1)
        if dist.is_initialized():
            dist.all_reduce(mine)
        return int(mine.item())

    def run(self, job: Probe) -> ProbeResult:
        if job.value < 0:  # a job that fails, as a CUDA worker's job can (test_supervisor)
            raise FAILURES[job.value]
        return ProbeResult(job.job_id, self._collective(torch.tensor([job.value])))

    def follow(self) -> None:
        while True:
            self._collective(torch.zeros(1, dtype=torch.int64))


def main(conn: Connection, spec_bytes: bytes, rank: int = 0, init_method: str | None = None) -> None:
    worker_main(conn, spec_bytes, rank, init_method)
