"""A worker's place in its torch.distributed group (one group per multi-process worker).

The server spawns the world_size processes of a group together and gives each its rank and
the group's rendezvous address; the group is created before the runner loads, so a runner
(e.g. the image decoder's Ulysses attention) finds torch.distributed ready. NCCL on CUDA,
gloo on CPU. A worker of world_size 1 creates no group at all.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupMember:
    rank: int = 0
    world_size: int = 1
    init_method: str | None = None  # "tcp://127.0.0.1:PORT", chosen by the server

    @property
    def is_leader(self) -> bool:
        """Rank 0: the process that owns the pipe to the server."""
        return self.rank == 0


def init_group(member: GroupMember, device: str, timeout_s: float = 300.0) -> None:
    if member.world_size == 1:
        return
    import datetime  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415 - only worker processes import torch

    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(
        backend,
        init_method=member.init_method,
        rank=member.rank,
        world_size=member.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def destroy_group(member: GroupMember) -> None:
    if member.world_size == 1:
        return
    import torch.distributed as dist  # noqa: PLC0415

    if dist.is_initialized():
        dist.destroy_process_group()
