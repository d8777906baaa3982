"""The vision decoder's Ulysses cases, run whole in each spawned rank of a gloo group.

Every rank loads the same tiny checkpoints and decodes the same batches; rank 0 saves what
it drew, which the test compares with one rank in its own process. One spawn of 4 ranks
serves 2 ranks too: the group of ranks 0 and 1 inside it.

The DiTs have 3 heads (divisible by neither 2 nor 4) and the images 144 x 80 pixels: a
9 x 5 grid of 45 tokens (patch 2), divisible by neither, so both paddings are exercised.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpu_workers.attention.ulysses import UlyssesAttention
from gpu_workers.distributed import GroupMember, destroy_group, init_group
from gpu_workers.tiny.checkpoints import TINY_DIT, make_tiny_vision_decoder
from gpu_workers.vision_decoder import decoder as vision_decoder
from gpu_workers.vision_decoder.decoder import Generation, Preview, VisionDecoder
from gpu_workers.vision_decoder.step_cache import StepCachePolicy
from omni.shared import protocol

GUIDANCES = ("autoguidance", "cfg")
THREE_HEADS = {**TINY_DIT, "hidden_size": 48, "num_heads": 3}  # head_dim 16 = 4 + 6 + 6
WIDTH, HEIGHT, STEPS = 144, 80, 3


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


def run_all(root: Path, group: dist.ProcessGroup | None) -> dict[str, dict[str, Any]]:
    return {g: draw(VisionDecoder.from_dir(root / g, group=group)) for g in GUIDANCES}


def main(rank: int, world_size: int, init_method: str, root: str, out: str) -> None:
    """Rank 0 saves {ranks: {guidance: draw()}} for the whole group and for ranks 0 and 1."""
    torch.set_num_threads(1)  # the ranks share a 2-core machine
    vision_decoder.UlyssesAttention = CountingAttention  # type: ignore[misc]  # in this process only
    member = GroupMember(rank, world_size, init_method)
    init_group(member, "cpu", timeout_s=120.0)
    try:
        pair = dist.new_group([0, 1])  # every rank takes part in making it
        results = {world_size: run_all(Path(root), dist.group.WORLD)}
        if rank < 2:
            results[2] = run_all(Path(root), pair)
        dist.barrier()
    finally:
        destroy_group(member)
    if rank == 0:
        torch.save(results, Path(out))
