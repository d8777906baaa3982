"""Ulysses attention over 2 and 4 gloo ranks equals full attention in one process (< 1e-5),
with heads and tokens that do not divide by the number of ranks; so do a stack of attention
and per-token MLP blocks (the decoder's pattern) and the image decoder's DiT itself, its
tokens and positions sharded and its output gathered as the decoder's driver does."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from gpu_workers.attention.ulysses import SequenceShard, UlyssesAttention, gather_sequence, shard_sequence
from tests.gpu_workers import ulysses_cases
from tests.gpu_workers.ulysses_cases import ATTENTION_CASES, CASES, unsharded


def run_group(world_size: int, out: Path, timeout_s: float = 120.0) -> dict[int, dict[str, torch.Tensor]]:
    init_method = f"file://{out.parent / 'rendezvous'}"
    args = (world_size, init_method, str(out))
    # forkserver, preloaded: torch is imported once, not once per rank (seconds each here),
    # and the server that forks the ranks has never run a thread pool that fork could break
    multiprocessing.get_context("forkserver").set_forkserver_preload([ulysses_cases.__name__])
    ctx = mp.start_processes(ulysses_cases.main, args=args, nprocs=world_size, join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1.0):  # raises ProcessRaisedException when a rank fails
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world_size} Ulysses ranks did not finish in {timeout_s:.0f} s")
    finally:
        for process in ctx.processes:
            if process.is_alive():
                process.kill()
    results: dict[int, dict[str, torch.Tensor]] = torch.load(out)
    return results


@pytest.fixture(scope="module")
def by_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, torch.Tensor]]:
    # One spawn serves both sizes (starting torch in a process costs seconds on this machine):
    # 4 ranks, and the group of ranks 0 and 1 inside them.
    return run_group(4, tmp_path_factory.mktemp("ulysses") / "results.pt")


@pytest.fixture(params=[2, 4], ids=lambda n: f"{n}-ranks")
def group_results(
    request: pytest.FixtureRequest, by_ranks: dict[int, dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    return by_ranks[request.param]


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_equals_unsharded(group_results: dict[str, torch.Tensor], name: str) -> None:
    expected = unsharded(CASES[name])
    got = group_results[name]
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < 1e-5


def test_a_rank_that_misnames_its_place_in_the_group_is_refused(group_results: dict[str, torch.Tensor]) -> None:
    assert "misnamed-rank-refused" in group_results


def test_one_rank_is_plain_sdpa_and_needs_no_group() -> None:
    case = ATTENTION_CASES[-1]
    q, k, v = case.qkv()
    attention = UlyssesAttention(None, world_size=1, rank=0, total_seq_len=case.seq, num_heads=case.heads)
    assert torch.equal(attention(q, k, v), unsharded(case))
    assert torch.equal(gather_sequence(q, None, case.seq, dim=2), q)


@pytest.mark.parametrize(
    ("total", "world", "spans"),
    [
        (37, 4, [(0, 10, 0), (10, 20, 0), (20, 30, 0), (30, 37, 3)]),
        (5, 4, [(0, 2, 0), (2, 4, 0), (4, 5, 1), (5, 5, 2)]),  # the last rank holds only padding
        (8, 2, [(0, 4, 0), (4, 8, 0)]),
    ],
)
def test_shards_cover_the_sequence_once_with_the_padding_at_the_tail(
    total: int, world: int, spans: list[tuple[int, int, int]]
) -> None:
    shards = [SequenceShard(total, world, rank) for rank in range(world)]
    assert [(s.start, s.stop, s.pad) for s in shards] == spans
    x = torch.arange(total).view(1, total, 1)
    locals_ = [shard_sequence(x, rank, world)[0] for rank in range(world)]
    assert all(local.shape == (1, shards[0].local_len, 1) for local in locals_)
    assert torch.equal(torch.cat(locals_, dim=1)[:, :total], x)  # what gather_sequence keeps


def test_a_shard_of_the_wrong_length_is_refused() -> None:
    attention = UlyssesAttention(None, world_size=4, rank=3, total_seq_len=37, num_heads=6)
    q = torch.zeros(1, 6, 7, 8)  # the real tokens only: the shard must be padded to 10
    with pytest.raises(ValueError, match=r"\(B, 6, 10, D\)"):
        attention(q, q, q)
