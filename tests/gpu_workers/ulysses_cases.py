"""The Ulysses parity cases, run whole in each spawned rank of a gloo group.

Every rank builds the same seeded inputs for the whole sequence, takes its shard, runs the
sharded computation and gathers; rank 0 saves the gathered outputs, which the test compares
with the unsharded computation in its own process. One spawn per world size serves every case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gpu_workers.distributed import GroupMember, destroy_group, init_group
from gpu_workers.ulysses import UlyssesAttention, gather_sequence, shard_sequence

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class AttentionCase:
    name: str
    batch: int
    heads: int
    seq: int
    head_dim: int = 8
    seed: int = 0

    def qkv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed)
        shape = (self.batch, self.heads, self.seq, self.head_dim)
        q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
        return q, k, v


@dataclass(frozen=True, slots=True)
class StackCase:
    name: str
    batch: int
    heads: int
    seq: int
    head_dim: int = 8
    depth: int = 2
    seed: int = 0

    def model(self) -> TinyStack:
        torch.manual_seed(self.seed)
        return TinyStack(self.heads, self.head_dim, self.depth).eval()

    def tokens(self) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed + 1)
        return torch.randn(self.batch, self.seq, self.heads * self.head_dim, generator=gen)  # (B, S, C)


class TinyBlock(nn.Module):
    """The decoder's pattern: per-token projections and QK-norm, then attention, then an MLP."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        width = heads * head_dim
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.q_norm = nn.RMSNorm(head_dim, eps=1e-6)
        self.k_norm = nn.RMSNorm(head_dim, eps=1e-6)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, attention: Attention) -> torch.Tensor:
        B, S, C = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)  # (B, H, S, D)
        out = attention(self.q_norm(q), self.k_norm(k), v)  # (B, H, S, D)
        x = x + self.proj(out.transpose(1, 2).reshape(B, S, C))
        return x + self.mlp(x)


class TinyStack(nn.Module):
    def __init__(self, heads: int, head_dim: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TinyBlock(heads, head_dim) for _ in range(depth))

    def forward(self, x: torch.Tensor, attention: Attention) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, attention)
        return x


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


# H=6 over 4 and H=3 over 2 pad heads; S=37 over 4 pads 3 tokens on the last rank; S=5 over 4
# leaves the last rank nothing but padding.
ATTENTION_CASES = [
    AttentionCase("even", batch=2, heads=8, seq=32),
    AttentionCase("heads-6", batch=2, heads=6, seq=32, seed=1),
    AttentionCase("heads-3", batch=2, heads=3, seq=32, seed=2),
    AttentionCase("seq-37", batch=2, heads=8, seq=37, seed=3),
    AttentionCase("both-uneven", batch=2, heads=6, seq=37, seed=4),
    AttentionCase("heads-3-seq-37", batch=2, heads=3, seq=37, seed=5),
    AttentionCase("seq-5", batch=1, heads=4, seq=5, seed=6),
]
STACK_CASES = [StackCase("stack", batch=2, heads=6, seq=37, seed=7)]
CASES: dict[str, AttentionCase | StackCase] = {case.name: case for case in ATTENTION_CASES}
CASES.update((case.name, case) for case in STACK_CASES)


def unsharded(case: AttentionCase | StackCase) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(case, AttentionCase):
            return full_attention(*case.qkv())
        return case.model()(case.tokens(), full_attention)


def sharded(case: AttentionCase | StackCase, rank: int, world_size: int) -> torch.Tensor:
    attention = UlyssesAttention(None, world_size, rank, case.seq, case.heads)
    with torch.no_grad():
        if isinstance(case, AttentionCase):
            q, k, v = (shard_sequence(t, rank, world_size, dim=2)[0] for t in case.qkv())
            return gather_sequence(attention(q, k, v), None, case.seq, dim=2)
        x, _ = shard_sequence(case.tokens(), rank, world_size, dim=1)
        return gather_sequence(case.model()(x, attention), None, case.seq, dim=1)


def main(rank: int, world_size: int, init_method: str, out: str) -> None:
    torch.set_num_threads(1)  # 2 or 4 ranks share a 2-core machine
    member = GroupMember(rank, world_size, init_method)
    init_group(member, "cpu", timeout_s=60.0)
    try:
        results = {name: sharded(case, rank, world_size) for name, case in CASES.items()}
        dist.barrier()
    finally:
        destroy_group(member)
    if rank == 0:
        torch.save(results, Path(out))
