"""The vision decoder's Ulysses cases, run whole in each spawned rank of a gloo group.

Every rank loads the same tiny checkpoints and decodes the same batches; rank 0 saves what
it drew, which the test compares with one rank in its own process. One spawn of 4 ranks
serves 2 ranks too (the group of ranks 0 and 1 inside it), and guidance parallelism over the
4: 2 guidance groups x 2 Ulysses ranks (GUIDANCE_PARALLEL).

The DiTs have 3 heads (divisible by neither 2 nor 4) and the images 144 x 80 pixels: a
9 x 5 grid of 45 tokens (patch 2), divisible by neither, so both paddings are exercised.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpu_workers.attention.ulysses import UlyssesAttention
from gpu_workers.distributed import GroupMember, destroy_group, init_group
from gpu_workers.tiny.checkpoints import TINY_DIT, make_tiny_vision_decoder
from gpu_workers.vision_decoder import guidance as vision_guidance
from gpu_workers.vision_decoder.decoder import Generation, Preview, VisionDecoder
from gpu_workers.vision_decoder.guidance import AutoGuidance
from gpu_workers.vision_decoder.guidance_parallel import GuidanceGroups
from gpu_workers.vision_decoder.step_cache import StepCachePolicy
from omni.shared import protocol

GUIDANCES = ("autoguidance", "cfg")
THREE_HEADS = {**TINY_DIT, "hidden_size": 48, "num_heads": 3}  # head_dim 16 = 4 + 6 + 6
WIDTH, HEIGHT, STEPS = 144, 80, 3
GUIDANCE_PARALLEL = "2x2"  # the results' key of 2 guidance groups x 2 Ulysses ranks
ONE_RANK_CFG_SEQUENTIAL = "1-cfg-sequential"  # one rank, CFG's two passes one after the other


def make_checkpoints(root: Path) -> dict[str, Path]:
    codebook = torch.randn(64, 16, generator=torch.Generator().manual_seed(11))
    return {
        g: make_tiny_vision_decoder(root / g, seed=7, codebook=codebook, guidance=g, dit=THREE_HEADS) for g in GUIDANCES
    }


def jobs() -> list[protocol.ImageJob]:
    codes = [(7 * i + 3) % 64 for i in range(64)]
    return [
        protocol.ImageJob(1, codes, WIDTH, HEIGHT, STEPS, seed=5, partial_images=1),
        protocol.ImageJob(2, codes[::-1], WIDTH, HEIGHT, STEPS, seed=6, guidance_scale=2.0),
    ]


class CountingAttention(UlyssesAttention):
    """UlyssesAttention that counts its sharded calls: proof that a group really shared the work."""

    sharded_calls = 0

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            CountingAttention.sharded_calls += 1
        return super().__call__(q, k, v)


def cached_jobs() -> list[protocol.ImageJob]:
    """Job 1 skips every step the policy lets it (steps 1 and 2 of 3), job 2 none: the ranks
    all-reduce the change and run job 2's rows alone."""
    first, second = jobs()
    return [replace(first, step_cache=1e9, partial_images=0), replace(second, step_cache=0.0)]


def draw(decoder: VisionDecoder) -> dict[str, Any]:
    """Rank 0: {"latents": (2, 16, h, w), "images": [bytes], "previews": [bytes],
    "sharded_calls": n, "cached": (2, 16, h, w), "skipped": [n, n]}."""
    CountingAttention.sharded_calls = 0
    previews: list[bytes] = []
    generation: Generation | None = None
    for event in decoder.generate(jobs()):
        if isinstance(event, Preview):
            previews.append(event.data)
        else:
            generation = event
    assert generation is not None
    sharded_calls = CountingAttention.sharded_calls
    decoder.step_cache_policy = StepCachePolicy(first_computed=1, last_computed=0)
    cached = decoder.decode(cached_jobs())
    return {
        "latents": generation.latents,
        "images": [image.data for image in generation.images],
        "previews": previews,
        "sharded_calls": sharded_calls,
        "cached": cached.latents,
        "skipped": [image.blocks_skipped for image in cached.images],
    }


def run_all(root: Path, group: dist.ProcessGroup | None, cfg_batched: bool = True) -> dict[str, dict[str, Any]]:
    return {g: draw(VisionDecoder.from_dir(root / g, group=group, cfg_batched=cfg_batched)) for g in GUIDANCES}


def run_guidance_parallel(root: Path, rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    """draw() over 2 guidance groups of world_size / 2 Ulysses ranks; plus, per guidance, each
    rank's (role, its DiT's blocks, whether it holds a second DiT), gathered in rank order."""
    groups = GuidanceGroups.split(rank, world_size)
    results = {}
    for g in GUIDANCES:
        decoder = VisionDecoder.from_dir(root / g, guidance_groups=groups)
        second = isinstance(decoder.guidance, AutoGuidance) and decoder.guidance.weak is not None
        mine = torch.tensor([groups.role, decoder.transformer.config.num_layers, int(second)])
        held = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(held, mine)
        results[g] = {**draw(decoder), "held": torch.stack(held).tolist()}
    return results


def main(rank: int, world_size: int, init_method: str, root: str, out: str) -> None:
    """Rank 0 saves {ranks: {guidance: draw()}} for the whole group and for ranks 0 and 1, and
    {GUIDANCE_PARALLEL: ...} for guidance parallelism over the whole group."""
    torch.set_num_threads(1)  # the ranks share a 2-core machine
    vision_guidance.UlyssesAttention = CountingAttention  # type: ignore[misc]  # in this process only
    member = GroupMember(rank, world_size, init_method)
    init_group(member, "cpu", timeout_s=120.0)
    try:
        pair = dist.new_group([0, 1])  # every rank takes part in making it
        results: dict[int | str, Any] = {world_size: run_all(Path(root), dist.group.WORLD)}
        if rank < 2:
            results[2] = run_all(Path(root), pair)
        results[GUIDANCE_PARALLEL] = run_guidance_parallel(Path(root), rank, world_size)
        dist.barrier()
    finally:
        destroy_group(member)
    if rank == 0:
        torch.save(results, Path(out))


def run_group(world_size: int, root: Path, timeout_s: float = 180.0) -> dict[int | str, dict[str, dict[str, Any]]]:
    """Spawn main() in world_size forkserver ranks; rank 0's results."""
    out = root / "results.pt"
    init_method = f"file://{root / 'rendezvous'}"
    multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])
    ctx = mp.start_processes(
        main,
        args=(world_size, init_method, str(root), str(out)),
        nprocs=world_size,
        join=False,
        start_method="forkserver",
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1.0):  # raises ProcessRaisedException when a rank fails
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world_size} vision decoder ranks did not finish in {timeout_s:.0f} s")
    finally:
        for process in ctx.processes:
            if process.is_alive():
                process.kill()
    results: dict[int | str, dict[str, dict[str, Any]]] = torch.load(out)
    return results


def by_ranks(root: Path) -> dict[int | str, dict[str, dict[str, Any]]]:
    """{4: ..., 2: ..., GUIDANCE_PARALLEL: ...} from one spawn of 4 ranks, and in this process
    {1: ...} and {ONE_RANK_CFG_SEQUENTIAL: {"cfg": ...}} (CFG's passes one after the other),
    all on one thread as the ranks run."""
    make_checkpoints(root)
    results = run_group(4, root)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results[1] = run_all(root, None)
        results[ONE_RANK_CFG_SEQUENTIAL] = {"cfg": draw(VisionDecoder.from_dir(root / "cfg", cfg_batched=False))}
    finally:
        torch.set_num_threads(before)
    return results
