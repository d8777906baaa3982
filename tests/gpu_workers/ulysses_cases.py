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

from gpu_workers.attention.ulysses import UlyssesAttention, gather_sequence, shard_sequence
from gpu_workers.distributed import GroupMember, destroy_group, init_group
from gpu_workers.models.flux_dit import FluxDiT, FluxDiTConfig, position_ids

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


@dataclass(frozen=True, slots=True)
class DiTCase:
    """The image decoder's DiT on random weights, its tokens a grid_h x grid_w latent grid."""

    name: str
    heads: int
    grid_h: int
    grid_w: int
    batch: int = 2
    seed: int = 0

    @property
    def seq(self) -> int:
        return self.grid_h * self.grid_w

    def config(self) -> FluxDiTConfig:
        # head_dim 8 = RoPE bands 2 | 2 | 4
        return FluxDiTConfig(
            in_channels=4,
            cond_channels=4,
            hidden_size=8 * self.heads,
            num_heads=self.heads,
            num_layers=2,
            axes_dims_rope=(2, 2, 4),
            vec_in_dim=8,
        )

    def model(self) -> FluxDiT:
        model = FluxDiT(self.config()).eval()
        gen = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():  # norms near 1, all else small noise: no term may hide at zero
            for name, p in sorted(model.named_parameters()):
                noise = torch.randn(p.shape, generator=gen)
                p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.1 * noise)
        return model

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.config()
        gen = torch.Generator().manual_seed(self.seed + 1)
        x = torch.randn(self.batch, self.seq, c.token_in_dim, generator=gen)  # (B, S, 4*(in + cond))
        vec = torch.randn(self.batch, c.vec_in_dim, generator=gen)
        timestep = torch.tensor([750.0, 125.0])[: self.batch]
        return x, position_ids(self.grid_h, self.grid_w), timestep, vec


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
# 5 x 7 = 35 tokens divide by neither 2 nor 4; 3 heads by neither, 6 heads not by 4
DIT_CASES = [DiTCase("dit-heads-3", heads=3, grid_h=5, grid_w=7, seed=8), DiTCase("dit-heads-6", 6, 5, 7, seed=9)]
Case = AttentionCase | StackCase | DiTCase
CASES: dict[str, Case] = {case.name: case for case in ATTENTION_CASES}
CASES.update((case.name, case) for case in STACK_CASES)
CASES.update((case.name, case) for case in DIT_CASES)


def unsharded(case: Case) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(case, AttentionCase):
            return full_attention(*case.qkv())
        if isinstance(case, StackCase):
            return case.model()(case.tokens(), full_attention)
        return case.model()(*case.inputs())  # the DiT's own default attention


def sharded(case: Case, group: dist.ProcessGroup) -> torch.Tensor:
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    attention = UlyssesAttention(group, world_size, rank, case.seq, case.heads)
    with torch.no_grad():
        if isinstance(case, AttentionCase):
            q, k, v = (shard_sequence(t, rank, world_size, dim=2)[0] for t in case.qkv())
            return gather_sequence(attention(q, k, v), group, case.seq, dim=2)
        if isinstance(case, StackCase):
            x, _ = shard_sequence(case.tokens(), rank, world_size, dim=1)
            return gather_sequence(case.model()(x, attention), group, case.seq, dim=1)
        # as the decoder's driver: tokens and their positions sharded alike, the output gathered
        tokens, positions, timestep, vec = case.inputs()
        x, _ = shard_sequence(tokens, rank, world_size, dim=1)  # (B, L, token_in_dim)
        local_positions, _ = shard_sequence(positions, rank, world_size, dim=0)  # (L, 3), padding at (0, 0, 0)
        out = case.model()(x, local_positions, timestep, vec, attention=attention)  # (B, L, token_out_dim)
        return gather_sequence(out, group, case.seq, dim=1)


def run_cases(group: dist.ProcessGroup) -> dict[str, torch.Tensor]:
    results = {name: sharded(case, group) for name, case in CASES.items()}
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    try:  # a rank that misnames its place in the group is refused, not left to hang
        UlyssesAttention(group, world_size, (rank + 1) % world_size, 8, 4)
    except ValueError:
        results["misnamed-rank-refused"] = torch.ones(())
    return results


def main(rank: int, world_size: int, init_method: str, out: str) -> None:
    """Every case on the whole group, then on the group of ranks 0 and 1 (the 2-rank cases,
    and a group that is not the default one); rank 0 saves {ranks: {case: gathered output}}."""
    torch.set_num_threads(1)  # the ranks share a 2-core machine
    member = GroupMember(rank, world_size, init_method)
    init_group(member, "cpu", timeout_s=120.0)
    try:
        world = dist.group.WORLD
        assert world is not None
        pair = dist.new_group([0, 1])  # every rank takes part in making it, ranks 0 and 1 in using it
        results = {world_size: run_cases(world)}
        if rank < 2:
            results[2] = run_cases(pair)
        dist.barrier()
    finally:
        destroy_group(member)
    if rank == 0:
        torch.save(results, Path(out))
