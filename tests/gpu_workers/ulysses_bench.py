"""Time one attention + MLP block at the decoder's reference width, 1 rank against N gloo ranks.

    .venv/bin/python -m tests.gpu_workers.ulysses_bench [--ranks 2] [--tokens 4000] [--cores 2]

The cores are split evenly: 1 rank gets every thread, N ranks get cores / N each. The two
are measured in turns inside one spawned group (rank 0 alone, the others waiting at a
barrier, then all N), so that load from elsewhere on a shared machine hits both alike; each
figure is the best of the turns. Not a test (no timing belongs in tests).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpu_workers.attention.ulysses import UlyssesAttention, shard_sequence
from gpu_workers.distributed import GroupMember, destroy_group, init_group
from tests.gpu_workers.ulysses_cases import TinyBlock

HEADS, HEAD_DIM = 24, 80  # hidden 1920, as the reference decoder


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall seconds, and CPU seconds summed over the ranks: the work done, which load from
    elsewhere hardly changes (a rank waiting at a barrier should add next to nothing)."""
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    fn()
    cpu = torch.tensor([time.process_time() - cpu_start], dtype=torch.float64)
    dist.barrier()
    wall = time.perf_counter() - start
    dist.all_reduce(cpu)
    return wall, float(cpu.item())


def _rank(rank: int, world_size: int, init_method: str, tokens: int, cores: int, turns: int, out: str) -> None:
    member = GroupMember(rank, world_size, init_method)
    init_group(member, "cpu", timeout_s=900.0)
    torch.manual_seed(0)
    block = TinyBlock(HEADS, HEAD_DIM).eval()
    x = torch.randn(1, tokens, HEADS * HEAD_DIM)
    local, _ = shard_sequence(x, rank, world_size)
    one = UlyssesAttention(None, 1, 0, tokens, HEADS)
    many = UlyssesAttention(None, world_size, rank, tokens, HEADS)
    q = torch.randn(1, HEADS, local.shape[1], HEAD_DIM)
    q_all = torch.randn(1, HEADS, tokens, HEAD_DIM)

    def alone() -> None:  # rank 0 with every core; the others wait at the barrier
        if rank == 0:
            torch.set_num_threads(cores)
            block(x, one)

    def alone_fewer_threads() -> None:  # rank 0 with one rank's share of the cores
        if rank == 0:
            torch.set_num_threads(max(1, cores // world_size))
            block(x, one)

    def attention_alone() -> None:
        if rank == 0:
            torch.set_num_threads(cores)
            one(q_all, q_all, q_all)

    def sharded() -> None:
        torch.set_num_threads(max(1, cores // world_size))
        block(local, many)

    def attention_only() -> None:
        torch.set_num_threads(max(1, cores // world_size))
        many(q, q, q)

    def all_to_alls() -> None:  # the communication alone: to head shards and back
        many._heads_to_sequence(many._sequence_to_heads(q, q, q)[0])

    names = ("alone", "alone-fewer-threads", "attention-alone", "sharded", "attention", "all-to-all")
    best = dict.fromkeys(names, float("inf"))
    cpu = dict.fromkeys(names, float("inf"))
    with torch.no_grad():
        for turn in range(turns + 1):  # turn 0 warms up: allocator, gloo buffers, kernels
            phases = (alone, alone_fewer_threads, attention_alone, sharded, attention_only, all_to_alls)
            for name, fn in zip(names, phases):
                wall, work = _timed(fn)
                if turn:
                    best[name], cpu[name] = min(best[name], wall), min(cpu[name], work)
    destroy_group(member)
    if rank == 0:
        Path(out).write_text(" ".join(f"{name}={best[name]},{cpu[name]}" for name in names))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times"
        spawn_args = (args.ranks, f"file://{tmp}/rendezvous", args.tokens, args.cores, args.turns, str(out))
        mp.start_processes(_rank, args=spawn_args, nprocs=args.ranks, start_method="spawn")
        measured = {name: t.split(",") for name, t in (kv.split("=") for kv in out.read_text().split())}
    best = {name: float(wall) for name, (wall, _) in measured.items()}
    cpu = {name: float(work) for name, (_, work) in measured.items()}
    share = max(1, args.cores // args.ranks)
    print(
        f"{args.tokens} tokens, hidden {HEADS * HEAD_DIM} ({HEADS} heads x {HEAD_DIM}), {args.cores} cores; "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after (others' work skews wall times)"
    )
    rows = [
        ("alone", f"1 rank, {args.cores} threads"),
        ("alone-fewer-threads", f"1 rank, {share} thread(s)"),
        ("attention-alone", f"  attention (1 rank, {args.cores} threads)"),
        ("sharded", f"{args.ranks} ranks, {share} thread(s) each"),
        ("attention", f"  its attention ({args.ranks} ranks)"),
        ("all-to-all", "  its two all-to-alls"),
    ]
    for name, label in rows:
        print(f"{label:<32} wall {best[name] * 1e3:7.0f} ms   CPU (all ranks) {cpu[name] * 1e3:7.0f} ms")
    print(
        f"speed-up: {best['alone'] / best['sharded']:.2f}x over 1 rank on every core, "
        f"{best['alone-fewer-threads'] / best['sharded']:.2f}x over 1 rank on one rank's share"
    )

if __name__ == "__main__":
    main()
