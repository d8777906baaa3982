"""GuidanceGroups: a guided step's two DiT passes on two groups of ranks at once.

A decoder group of 2N ranks splits in two guidance groups of N, each a Ulysses group over its
own N (--image-guidance-parallel; omni/engines/worker_specs.py:DecoderLayout says which device
lists allow it):

    global rank     0 ....... N-1 | N ........ 2N-1
    guidance role   0             | 1
    runs            transformer   | transformer2 (autoguidance's twin)
    (CFG)           conditional   | unconditional pass, the same transformer on both
    pair group      {i, N+i}: rank i of role 0 and rank i of role 1 hold the same token shard

Each rank loads only its own role's DiT. At every step each rank runs its pass over its shard
(guidance.py: parallel_velocity), then one all_gather over its pair (exchange) gives both ranks
of the pair both predictions of that shard; both combine them as the sequential path does
(pred + g * (pred - pred2), or CFG's), so both groups take the same Euler step and hold the
same latent: nothing else is exchanged. A step in which no job is guided (autoguidance at
scale 0) skips role 1's pass: it sends zeros and role 0's prediction is taken as it is,
exactly as the sequential path skips the twin.

The step cache keeps its memory per pass on the ranks that run that pass (its sums over the own
Ulysses group); at the end the pair's block counts are summed, so rank 0 reports both passes'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class GuidanceGroups:
    """This rank's place in a decoder group split for guidance parallelism, and the step's one
    exchange over it. Which pass a role runs, and how two predictions combine, are the guidance
    class's (guidance.py: TwoPassGuidance)."""

    role: int  # 0: the main transformer (CFG: the conditional pass); 1: the twin (CFG: the unconditional)
    ulysses: dist.ProcessGroup  # the N ranks of this role, sharding the tokens
    pair: dist.ProcessGroup  # this rank and the rank of the other role that holds the same shard

    @classmethod
    def split(cls, rank: int, world_size: int) -> GuidanceGroups:
        """Every rank of the world calls it, in the same order (torch.distributed's new_group rule)."""
        if world_size < 2 or world_size % 2:
            raise ValueError(f"guidance parallelism needs an even number of ranks (2 x N), got {world_size}")
        n = world_size // 2
        roles = [dist.new_group(list(range(n))), dist.new_group(list(range(n, 2 * n)))]
        pairs = [dist.new_group([i, n + i]) for i in range(n)]
        return cls(rank // n, roles[rank // n], pairs[rank % n])

    def exchange(self, own: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's prediction of its shard (B, L, C) -> (role 0's, role 1's) of that shard,
        the same on both ranks of the pair: one all_gather."""
        both = [torch.empty_like(own), torch.empty_like(own)]
        dist.all_gather(both, own.contiguous(), group=self.pair)
        return both[0], both[1]

    def sum_counts(self, computed: list[int], skipped: list[int], device: torch.device) -> tuple[list[int], list[int]]:
        """The step cache's per-job block counts of this rank's pass -> both passes'. device:
        the decoder's (NCCL reduces device tensors)."""
        counts = torch.tensor([computed, skipped], dtype=torch.int64, device=device)  # (2, B)
        dist.all_reduce(counts, group=self.pair)
        both = counts.cpu().tolist()
        return both[0], both[1]
