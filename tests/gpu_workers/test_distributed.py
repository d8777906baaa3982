"""A group's ranks meet where rank 0 bound its store (review D3): no port is chosen by one
process, freed, and bound again by another, which a third could take in between."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

from gpu_workers.distributed import GroupMember, Rendezvous, destroy_group, init_group


def _rank(rank: int, world_size: int, rendezvous: Rendezvous, out: Any) -> None:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    member = init_group(GroupMember(rank, world_size, rendezvous), "cpu", timeout_s=120)
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)
    out.put((rank, int(total.item()), dist.get_world_size()))
    dist.barrier(member.handoff)
    destroy_group(member)


def test_three_ranks_meet_at_the_port_rank_0_bound() -> None:
    ctx = mp.get_context("spawn")
    rendezvous, out = Rendezvous(ctx.Queue()), ctx.Queue()
    world_size = 3
    processes = [ctx.Process(target=_rank, args=(r, world_size, rendezvous, out)) for r in range(world_size)]
    for p in processes:
        p.start()
    results = sorted(out.get(timeout=120) for _ in processes)
    for p in processes:
        p.join(30)
    # every rank joined the one group rank 0 served: 1 + 2 + 3 on each
    assert results == [(r, 6, world_size) for r in range(world_size)]
    assert [p.exitcode for p in processes] == [0] * world_size
    assert rendezvous.ports.empty()  # one port handed to each follower, none left over
