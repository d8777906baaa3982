"""Guidance parallelism over 4 gloo ranks (2 guidance groups x 2 Ulysses ranks) against one
rank: the same latents, image bytes and previews exactly, each rank holding only its own
model, every attention call sharded over its group, and the step cache's decisions and counts
those of one rank. The ranks are spawned once for this file and test_decoder.py's Ulysses tests
(conftest.py's by_ranks, tests/gpu_workers/vision_decoder/cases.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpu_workers.vision_decoder.guidance_parallel import GuidanceGroups
from tests.gpu_workers.vision_decoder.cases import GUIDANCE_PARALLEL, GUIDANCES, ONE_RANK_CFG_SEQUENTIAL

Results = dict[int | str, dict[str, dict[str, Any]]]


def _one_rank(by_ranks: Results, guidance: str) -> dict[str, Any]:
    """The sequential path the parallel one must equal exactly: one rank, its passes one after
    the other (CFG's default batched pass agrees with that to float rounding only)."""
    return by_ranks[ONE_RANK_CFG_SEQUENTIAL if guidance == "cfg" else 1][guidance]


@pytest.mark.parametrize("guidance", GUIDANCES)
def test_two_guidance_groups_of_two_ranks_draw_what_one_rank_draws_exactly(by_ranks: Results, guidance: str) -> None:
    one, parallel = _one_rank(by_ranks, guidance), by_ranks[GUIDANCE_PARALLEL][guidance]
    assert parallel["latents"].shape == one["latents"].shape == (2, 16, 10, 18)
    assert torch.equal(parallel["latents"], one["latents"])
    assert parallel["images"] == one["images"] and all(one["images"])
    assert parallel["previews"] == one["previews"] and len(one["previews"]) == 1
    # each pass's 2 ranks shard it: rank 0 ran the main DiT's (or the conditional pass's) 2 blocks
    # at each of the 3 steps, and no other pass
    assert parallel["sharded_calls"] == 2 * 3


def test_cfg_in_parallel_agrees_with_the_batched_default_to_float_rounding(by_ranks: Results) -> None:
    batched, parallel = by_ranks[1]["cfg"], by_ranks[GUIDANCE_PARALLEL]["cfg"]
    assert (parallel["latents"] - batched["latents"]).abs().max().item() < 1e-5


@pytest.mark.parametrize("guidance", GUIDANCES)
def test_each_rank_holds_only_its_own_guidance_models_weights(by_ranks: Results, guidance: str) -> None:
    # (role, blocks of the rank's DiT, holds a second DiT) of ranks 0..3; the tiny twin has 1 block
    held = by_ranks[GUIDANCE_PARALLEL][guidance]["held"]
    twin_blocks = 1 if guidance == "autoguidance" else 2  # CFG's two passes run the one transformer
    assert held == [[0, 2, 0], [0, 2, 0], [1, twin_blocks, 0], [1, twin_blocks, 0]]


@pytest.mark.parametrize("guidance", GUIDANCES)
def test_the_step_cache_keeps_each_guidance_models_memory_on_its_own_ranks(by_ranks: Results, guidance: str) -> None:
    # each group decides its own pass's skips (its change summed over its 2 ranks), and rank 0
    # reports both passes' counts: those of one rank, and the same latents
    one, parallel = _one_rank(by_ranks, guidance), by_ranks[GUIDANCE_PARALLEL][guidance]
    assert parallel["skipped"] == one["skipped"] and one["skipped"][0] > 0 and one["skipped"][1] == 0
    assert torch.equal(parallel["cached"], one["cached"])


def test_an_odd_world_cannot_split_in_two_guidance_groups() -> None:
    with pytest.raises(ValueError, match="an even number of ranks"):
        GuidanceGroups.split(0, 3)
