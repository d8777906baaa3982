"""The first-block cache: its decisions and counts on blocks whose residuals we choose, and
through the decoder on tiny random checkpoints (threshold 0 byte-equal to no cache, the forced
steps, the skipped counts, each guidance pass's own memory, a batch's rows apart)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from gpu_workers.models import flux_dit
from gpu_workers.tiny.checkpoints import TINY_DIT, make_tiny_vision_decoder
from gpu_workers.vision_decoder import guidance as vision_guidance
from gpu_workers.vision_decoder.decoder import VisionDecoder
from gpu_workers.vision_decoder.step_cache import StepCache, StepCachePolicy
from omni.shared import protocol
from tests.gpu_workers.vision_decoder.cases import GUIDANCES

SIZE = 128  # 64 tokens (patch 2)
CODES = [(5 * i + 1) % 64 for i in range(64)]
STEPS = 8
LAYERS = 3  # the main DiT's; autoguidance's weak twin has 1
ALWAYS = 1e9  # a threshold every non-forced step is under


class Block:
    """A stand-in block: h + residual(step), recording each call's rows."""

    def __init__(self, residual: torch.Tensor) -> None:
        self.residual = residual  # (R, L, hidden) what it adds at the current call
        self.calls: list[int] = []

    def __call__(self, h: torch.Tensor, temb: torch.Tensor, rope: Any, attention: Any) -> torch.Tensor:
        self.calls.append(h.shape[0])
        return h + self.residual[: h.shape[0]] * temb[:, None, :1]


def stand_ins(first: torch.Tensor, rest: float, n: int = 3) -> list[Block]:
    return [Block(first)] + [Block(torch.full_like(first, rest)) for _ in range(n - 1)]


def run(cache: StepCache, name: str, blocks: list[Block], rows: int, step: int) -> torch.Tensor:
    cache.step = step
    h = torch.zeros(rows, 4, 2)
    temb = torch.ones(rows, 2)
    return cache.runner(name)(blocks, h, temb, (torch.empty(0), torch.empty(0)), lambda q, k, v: v)  # type: ignore[arg-type]


def test_the_relative_change_is_mean_abs_difference_over_mean_abs_of_the_computed_step() -> None:
    cache = StepCache([0.2, 0.3], steps=10, valid_tokens=4, policy=StepCachePolicy(1, 0))
    first = torch.ones(2, 4, 2)
    blocks = stand_ins(first, rest=5.0)
    assert run(cache, "main", blocks, 2, 0).tolist() == torch.full((2, 4, 2), 11.0).tolist()  # forced
    # row 0 moves by 0.25 (over 0.2: runs), row 1 by 0.25 too (under 0.3: skips)
    blocks[0].residual = torch.stack((torch.full((4, 2), 1.25), torch.full((4, 2), 0.75)))
    blocks[1].residual = blocks[2].residual = torch.full((2, 4, 2), 7.0)
    out = run(cache, "main", blocks, 2, 1)
    assert out[0].unique().tolist() == [1.25 + 14.0]  # computed
    assert out[1].unique().tolist() == [0.75 + 10.0]  # block 0's new output + the cached residual of 1..2
    assert blocks[1].calls == [2, 1]  # the second call ran row 0 alone
    assert cache.blocks_computed == [6, 4] and cache.blocks_skipped == [0, 2]


def test_the_memory_is_the_last_computed_step_not_the_last_step() -> None:
    # 0.1 a step: each step alone is under 0.15, but two steps since the blocks ran are not
    cache = StepCache([0.15], steps=10, valid_tokens=4, policy=StepCachePolicy(1, 0))
    blocks = stand_ins(torch.ones(1, 4, 2), rest=1.0)
    skipped = []
    for step in range(5):
        blocks[0].residual = torch.full((1, 4, 2), 1.0 + 0.1 * step)
        before = cache.blocks_skipped[0]
        run(cache, "main", blocks, 1, step)
        skipped.append(cache.blocks_skipped[0] > before)
    assert skipped == [False, True, False, True, False]


def test_padding_tokens_take_no_part_in_the_change() -> None:
    cache = StepCache([0.5], steps=10, valid_tokens=2, policy=StepCachePolicy(1, 0))
    blocks = stand_ins(torch.ones(1, 4, 2), rest=1.0)
    run(cache, "main", blocks, 1, 0)
    blocks[0].residual = torch.tensor([[[1.0, 1.0], [1.0, 1.0], [99.0, -99.0], [0.0, 7.0]]])  # tokens 2, 3: padding
    run(cache, "main", blocks, 1, 1)
    assert cache.blocks_skipped == [2]


def test_the_forced_steps_always_compute() -> None:
    steps = 7
    cache = StepCache([ALWAYS], steps=steps, valid_tokens=4, policy=StepCachePolicy(2, 1))
    blocks = stand_ins(torch.ones(1, 4, 2), rest=1.0)
    ran = []
    for step in range(steps):
        calls = len(blocks[1].calls)
        run(cache, "main", blocks, 1, step)
        ran.append(len(blocks[1].calls) > calls)
    assert ran == [True, True, False, False, False, False, True]
    assert cache.blocks_skipped == [4 * 2] and cache.blocks_computed == [3 * 3 + 4]


def test_each_pass_has_its_own_memory() -> None:
    cache = StepCache([0.1], steps=10, valid_tokens=4, policy=StepCachePolicy(1, 0))
    main = stand_ins(torch.ones(1, 4, 2), rest=1.0)
    weak = stand_ins(torch.ones(1, 4, 2), rest=1.0, n=2)
    for step in range(3):
        run(cache, "main", main, 1, step)  # the same residual each step: skips after step 0
        weak[0].residual = torch.full((1, 4, 2), 2.0**step)  # doubles each step: never skips
        run(cache, "weak", weak, 1, step)
    assert len(main[1].calls) == 1 and len(weak[1].calls) == 3
    assert cache.blocks_skipped == [2 * 2]


def test_a_cfg_batch_of_2b_rows_counts_each_row_to_its_job() -> None:
    cache = StepCache([ALWAYS, 0.0], steps=10, valid_tokens=4, policy=StepCachePolicy(1, 0))
    blocks = stand_ins(torch.ones(4, 4, 2), rest=1.0)
    for step in range(2):
        run(cache, "both", blocks, 4, step)
    assert blocks[1].calls == [4, 2]  # step 1: job 1's conditional and unconditional rows
    assert cache.blocks_skipped == [2 * 2, 0] and cache.blocks_computed == [3 * 2 + 2, 3 * 4]


def test_all_thresholds_0_run_the_blocks_as_run_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = StepCache([0.0, 0.0], steps=4, valid_tokens=4)
    calls: list[tuple[Any, ...]] = []

    def run_blocks(*args: Any) -> torch.Tensor:
        calls.append(args)
        return args[1]

    monkeypatch.setattr("gpu_workers.vision_decoder.step_cache.run_blocks", run_blocks)
    run(cache, "main", stand_ins(torch.ones(2, 4, 2), rest=1.0), 2, 2)
    assert len(calls) == 1 and len(calls[0][0]) == 3  # every block, in one call, no memory kept
    assert cache.blocks_computed == [3, 3] and cache.blocks_skipped == [0, 0]


# ---------------------------------------------------------------------------------------------
# Through the decoder.


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def decoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, VisionDecoder]:
    root = tmp_path_factory.mktemp("step_cache")
    codebook = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))
    dit = {**TINY_DIT, "num_layers": LAYERS}
    return {
        g: VisionDecoder.from_dir(make_tiny_vision_decoder(root / g, seed=1, codebook=codebook, guidance=g, dit=dit))
        for g in GUIDANCES
    }


def job(job_id: int = 1, **fields: Any) -> protocol.ImageJob:
    values: dict[str, Any] = {"codes": CODES, "width": SIZE, "height": SIZE, "steps": STEPS, "seed": 0} | fields
    return protocol.ImageJob(job_id, **values)


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.mark.parametrize("guidance", GUIDANCES)
def test_threshold_0_is_byte_equal_to_no_cache(
    decoders: dict[str, VisionDecoder], guidance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoder = decoders[guidance]
    cached = decoder.decode([job(step_cache=0.0), job(2, seed=9, guidance_scale=2.0)])
    # no cache at all: every pass runs its blocks in one loop, as before the cache existed
    monkeypatch.setattr(vision_guidance.StepInputs, "blocks", lambda self, name: flux_dit.run_blocks)
    plain = decoder.decode([job(step_cache=0.0), job(2, seed=9, guidance_scale=2.0)])
    assert [i.data for i in cached.images] == [i.data for i in plain.images]
    assert cached.latents is not None and plain.latents is not None
    assert torch.equal(cached.latents, plain.latents)
    assert all(i.blocks_skipped == 0 for i in cached.images)


@pytest.mark.parametrize(("guidance", "computed", "skipped"), [
    # autoguidance: main 3 blocks + weak 1 a step; steps 2..6 of 8 skip the main's blocks 1..2
    ("autoguidance", STEPS * (LAYERS + 1) - 5 * 2, 5 * 2),
    # cfg, batched: a conditional and an unconditional row of 3 blocks a step, both skip
    ("cfg", STEPS * 2 * LAYERS - 5 * 2 * 2, 5 * 2 * 2),
])  # fmt: skip
def test_skipped_counts(decoders: dict[str, VisionDecoder], guidance: str, computed: int, skipped: int) -> None:
    image = decoders[guidance].decode([job(step_cache=ALWAYS)]).images[0]
    assert (image.blocks_computed, image.blocks_skipped) == (computed, skipped)
    off = decoders[guidance].decode([job()]).images[0]
    assert (off.blocks_computed, off.blocks_skipped) == (computed + skipped, 0)


@pytest.mark.parametrize("guidance", GUIDANCES)
def test_a_cached_row_changes_its_image_only(decoders: dict[str, VisionDecoder], guidance: str) -> None:
    decoder = decoders[guidance]
    alone = decoder.decode([job(), job(2, seed=4)])
    mixed = decoder.decode([job(step_cache=ALWAYS), job(2, seed=4)])
    assert mixed.latents is not None and alone.latents is not None
    # its row ran every block, in a smaller batch after block 0: equal to float rounding, as a
    # batch equals its jobs alone (test_decoder.py)
    assert (mixed.latents[1] - alone.latents[1]).abs().max().item() < 1e-5
    assert (mixed.latents[0] - alone.latents[0]).abs().max().item() > 1e-2
    assert mixed.images[0].blocks_skipped > 0 and mixed.images[1].blocks_skipped == 0


def test_when_only_forced_steps_remain_the_cache_changes_nothing(decoders: dict[str, VisionDecoder]) -> None:
    decoder = decoders["autoguidance"]
    on, off = decoder.decode([job(steps=3, step_cache=ALWAYS)]), decoder.decode([job(steps=3)])
    assert on.images[0].data == off.images[0].data and on.images[0].blocks_skipped == 0


def test_a_bad_threshold_is_the_jobs_error(decoders: dict[str, VisionDecoder]) -> None:
    images = decoders["cfg"].decode([job(step_cache=-0.5), job(2, step_cache=float("nan")), job(3)]).images
    assert images[0].error == "step_cache must be a finite number >= 0, got -0.5"
    assert images[1].error is not None and "step_cache" in images[1].error
    assert images[2].error is None and pixels(images[2].data).shape == (SIZE, SIZE, 3)
