"""Ulysses sequence parallelism: exact full attention over a sequence sharded across a group.

Every rank of a torch.distributed group (NCCL on GPU, gloo on CPU) holds the same weights and
one contiguous shard of the tokens; everything per token (projections, norms, RoPE, MLPs) runs
on the shard with no communication. Only attention needs the whole sequence, so inside it one
all-to-all turns sequence shards into head shards, each rank attends over all tokens for its
heads, and one all-to-all turns the result back.

Shards (S tokens over N ranks, L = ceil(S / N) per rank, the tail padded):

    global position   0 ....... L-1 | L ...... 2L-1 | ... | (N-1)L ..... S-1  S ... NL-1
    held by           rank 0        | rank 1        | ... | rank N-1 (real)   (padding)

The padding is always the tail [S, NL) of the padded sequence (with S small next to N a rank
before the last can be all padding), so after the first all-to-all every rank sees the real
tokens at [0, S) and drops the padded keys; padded query rows come back as junk the caller
drops with `gather_sequence`. Heads are zero-padded up to a multiple of N; a padded head never
mixes with a real one and is dropped after the second all-to-all. Both paddings are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class SequenceShard:
    """One rank's slice [start, stop) of a sequence of total_len tokens, padded to local_len."""

    total_len: int
    world_size: int
    rank: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside a group of {self.world_size}")
        if self.total_len < 1:
            raise ValueError("a sequence to shard needs at least one token")

    @property
    def local_len(self) -> int:
        return -(-self.total_len // self.world_size)

    @property
    def padded_len(self) -> int:
        return self.local_len * self.world_size

    @property
    def start(self) -> int:
        return min(self.rank * self.local_len, self.total_len)

    @property
    def stop(self) -> int:
        return min((self.rank + 1) * self.local_len, self.total_len)

    @property
    def pad(self) -> int:
        return self.local_len - (self.stop - self.start)


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, dim: int = 1) -> tuple[torch.Tensor, int]:
    """This rank's tokens of x along dim, zero-padded to ceil(len / world_size); and the pad."""
    shard = SequenceShard(x.shape[dim], world_size, rank)
    local = x.narrow(dim, shard.start, shard.stop - shard.start)
    if shard.pad:
        pad_shape = list(x.shape)
        pad_shape[dim] = shard.pad
        local = torch.cat((local, x.new_zeros(pad_shape)), dim=dim)
    return local.contiguous(), shard.pad


def gather_sequence(
    local: torch.Tensor, group: dist.ProcessGroup | None, total_len: int, dim: int = 1
) -> torch.Tensor:
    """The whole sequence on every rank, from each rank's padded shard along dim."""
    world_size = dist.get_world_size(group) if dist.is_initialized() else 1
    if world_size == 1:
        return local.narrow(dim, 0, total_len)
    expected = SequenceShard(total_len, world_size, 0).local_len
    if local.shape[dim] != expected:
        got = local.shape[dim]
        raise ValueError(f"a shard of {total_len} tokens over {world_size} ranks has {expected}, not {got}")
    local = local.contiguous()
    shards = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(shards, local, group=group)
    # padded positions are the tail [total_len, world_size * local_len) of the concatenation
    return torch.cat(shards, dim=dim).narrow(dim, 0, total_len)


class UlyssesAttention:
    """attention(q, k, v) -> out for a DiT whose tokens are sharded over a group.

    q, k, v: (B, H, L, D), this rank's L = ceil(S / N) tokens (padded as `shard_sequence`
    pads them), after QK-norm and RoPE; out: (B, H, L, D). With world_size 1 it is plain sdpa
    over the whole sequence and needs no group.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        world_size: int,
        rank: int,
        total_seq_len: int,
        num_heads: int,
    ) -> None:
        if world_size > 1 and dist.is_initialized():
            actual = (dist.get_rank(group), dist.get_world_size(group))
            if actual != (rank, world_size):
                raise ValueError(f"rank {rank} of {world_size} is rank {actual[0]} of {actual[1]} in its group")
        self.group = group
        self.shard = SequenceShard(total_seq_len, world_size, rank)
        self.num_heads = num_heads
        self.heads_per_rank = -(-num_heads // world_size)

    @property
    def world_size(self) -> int:
        return self.shard.world_size

    @property
    def padded_heads(self) -> int:
        return self.heads_per_rank * self.world_size

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, H, L, D = q.shape
        if H != self.num_heads or L != self.shard.local_len or k.shape != q.shape or v.shape != q.shape:
            raise ValueError(
                f"expected q, k, v of (B, {self.num_heads}, {self.shard.local_len}, D), "
                f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
            )
        if self.world_size == 1:
            return F.scaled_dot_product_attention(q, k, v)
        return self._heads_to_sequence(self._attend(self._sequence_to_heads(q, k, v)))

    def _sequence_to_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        N, h = self.world_size, self.heads_per_rank
        B, H, L, D = q.shape
        qkv = torch.stack((q, k, v))  # (3, B, H, L, D): one all-to-all for all three
        if self.padded_heads > H:
            qkv = F.pad(qkv, (0, 0, 0, 0, 0, self.padded_heads - H))  # (3, B, N*h, L, D)
        # block j = heads [j*h, (j+1)*h) goes to rank j; gloo wants contiguous, equal blocks
        send = qkv.view(3, B, N, h, L, D).permute(2, 0, 1, 3, 4, 5).contiguous()  # (N, 3, B, h, L, D)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        # block i came from rank i: our heads at tokens [i*L, (i+1)*L), so rank order is token order
        return recv.permute(1, 2, 3, 0, 4, 5).reshape(3, B, h, N * L, D)

    def _attend(self, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.unbind(0)  # (B, h, N*L, D)
        # Dropping the padded keys [S, N*L) is the -inf mask on those columns, exactly, and
        # keeps sdpa on its mask-free kernels; padded query rows still get (junk) outputs.
        real = self.shard.total_len
        return F.scaled_dot_product_attention(q, k[:, :, :real], v[:, :, :real])  # (B, h, N*L, D)

    def _heads_to_sequence(self, out: torch.Tensor) -> torch.Tensor:
        N, h, L = self.world_size, self.heads_per_rank, self.shard.local_len
        B, _, _, D = out.shape
        send = out.view(B, h, N, L, D).permute(2, 0, 1, 3, 4).contiguous()  # (N, B, h, L, D): tokens of rank j
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        # block i came from rank i: heads [i*h, (i+1)*h) of our tokens
        heads = recv.permute(1, 0, 2, 3, 4).reshape(B, N * h, L, D)
        return heads[:, : self.num_heads]  # (B, H, L, D): padded heads dropped
