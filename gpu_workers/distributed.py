"""A worker's place in its torch.distributed group (one group per multi-process worker).

The server spawns the world_size processes of a group together and gives each its rank and
the group's rendezvous address; the group is created before the runner loads, so a runner
(e.g. the image decoder's Ulysses attention) finds torch.distributed ready. A worker of
world_size 1 creates no group at all.

A group is two process groups over the same ranks:

    collectives  NCCL on CUDA, gloo on CPU  the runner's all-to-alls and gathers, inside a job;
                                            a wait past COLLECTIVE_TIMEOUT_S is a hung group
    hand-off     gloo, on the CPU            rank 0 handing the next job to the others; the
                                            followers wait here between jobs, for as long as
                                            the server stays idle (HANDOFF_TIMEOUT)

Waiting for the next job inside a timed collective made an idle group kill itself when the
timeout struck (review A1: NCCL's watchdog, or gloo's timeout, after 300 s idle), and an NCCL
wait spins a core and a kernel on the GPU; gloo's blocks.

The server's groups meet at a Rendezvous: rank 0 binds the store's port itself (port 0: the
kernel picks a free one, and it stays bound) and hands the number to the others. A port chosen
by the server, freed, then bound again by rank 0 could be taken in between (review D3).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass
from typing import Any

COLLECTIVE_TIMEOUT_S = 300.0
# Tests make it short, to show an idle group outlives it without waiting minutes.
TIMEOUT_ENV = "OMNI_GROUP_TIMEOUT_S"
# "Unbounded" in practice: gloo takes a finite timeout; ten years of idleness ends the group.
HANDOFF_TIMEOUT = datetime.timedelta(days=3650)


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where a group's ranks meet: rank 0 binds a TCPStore on a port of the kernel's choosing
    and puts that port on `ports` once for each other rank, which take it from there."""

    ports: Any  # a multiprocessing Queue of the spawn context, made by the server
    host: str = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class GroupMember:
    rank: int = 0
    world_size: int = 1
    # The server's Rendezvous, or a torch init_method URL (tests: "file://...")
    init_method: Rendezvous | str | None = None
    handoff: Any = None  # the hand-off ProcessGroup, once init_group has made it

    @property
    def is_leader(self) -> bool:
        """Rank 0: the process that owns the pipe to the server."""
        return self.rank == 0


def collective_timeout_s() -> float:
    value = os.environ.get(TIMEOUT_ENV)
    return float(value) if value else COLLECTIVE_TIMEOUT_S


def init_group(member: GroupMember, device: str, timeout_s: float | None = None) -> GroupMember:
    """Join the group; return the member with its hand-off group (the member itself when alone)."""
    if member.world_size == 1:
        return member
    import torch.distributed as dist  # noqa: PLC0415 - only worker processes import torch

    backend = "nccl" if device.startswith("cuda") else "gloo"
    timeout = timeout_s if timeout_s is not None else collective_timeout_s()
    delta = datetime.timedelta(seconds=timeout)
    if isinstance(member.init_method, Rendezvous):
        store = _meet(member.init_method, member.rank, member.world_size, delta)
        dist.init_process_group(backend, store=store, rank=member.rank, world_size=member.world_size, timeout=delta)
    else:
        dist.init_process_group(
            backend, init_method=member.init_method, rank=member.rank, world_size=member.world_size, timeout=delta
        )
    handoff = dist.new_group(backend="gloo", timeout=HANDOFF_TIMEOUT)
    return dataclasses.replace(member, handoff=handoff)


def _meet(rendezvous: Rendezvous, rank: int, world_size: int, timeout: datetime.timedelta) -> Any:
    """The group's TCPStore: rank 0 serves it on the port it bound, the others connect to it."""
    import torch.distributed as dist  # noqa: PLC0415

    if rank == 0:
        store = dist.TCPStore(rendezvous.host, 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        for _ in range(world_size - 1):
            rendezvous.ports.put(store.port)
        return store
    port = rendezvous.ports.get(timeout=timeout.total_seconds())
    return dist.TCPStore(rendezvous.host, port, world_size, is_master=False, timeout=timeout)


def destroy_group(member: GroupMember) -> None:
    if member.world_size == 1:
        return
    import torch.distributed as dist  # noqa: PLC0415

    if dist.is_initialized():
        dist.destroy_process_group()
