"""The guidance classes on one process: what each guidance role loads, and a step's velocity
from the two passes run apart and exchanged (parallel_velocity, with the pair's exchange played
here) equal, bit for bit, to the two passes run one after the other. The same over real gloo
ranks: test_guidance_parallel.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from gpu_workers.models.flux_dit import FluxDiT, patchify, position_ids
from gpu_workers.tiny.checkpoints import make_tiny_vision_decoder
from gpu_workers.vision_decoder.guidance import (
    AutoGuidance,
    ClassifierFreeGuidance,
    StepInputs,
    TokenShard,
    TwoPassGuidance,
    parallel_velocity,
)
from gpu_workers.vision_decoder.guidance_parallel import GuidanceGroups
from gpu_workers.vision_decoder.layout import DecoderFolder
from tests.gpu_workers.vision_decoder.cases import GUIDANCES

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, DecoderFolder]:
    root = tmp_path_factory.mktemp("guidance")
    codebook = torch.randn(64, 16, generator=torch.Generator().manual_seed(5))
    return {
        g: DecoderFolder.read(make_tiny_vision_decoder(root / g, seed=3, codebook=codebook, guidance=g), torch.device("cpu"))
        for g in GUIDANCES
    }


@dataclass(frozen=True, slots=True)
class PlayedPair(GuidanceGroups):
    """A rank of role 0 whose pair is played in this process: exchange returns the pair's
    prediction as it was computed beforehand."""

    others: torch.Tensor | None = None

    def exchange(self, own: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.others is not None
        return (own, self.others) if self.role == 0 else (self.others, own)


def _step(model: FluxDiT, scales: list[float]) -> StepInputs:
    """One step of 2 jobs over an 8 x 8 token grid, seeded."""
    c, gen = model.config, torch.Generator().manual_seed(9)
    shard = 8 * c.patch
    x = patchify(torch.randn(2, c.in_channels, shard, shard, generator=gen), c.patch)  # (2, 64, p*p*16)
    cond = torch.randn(2, 64, c.condition_patch**2 * c.cond_channels, generator=gen)
    vec = torch.randn(2, c.cond_channels, generator=gen)
    timestep = torch.tensor([750.0, 750.0])
    return StepInputs(x, cond, vec, timestep, torch.tensor(scales), guided=any(s != 0 for s in scales))


@pytest.mark.parametrize("guidance", GUIDANCES)
def test_a_guidance_role_loads_its_own_pass_model_only(folders: dict[str, DecoderFolder], guidance: str) -> None:
    folder = folders[guidance]
    cls = AutoGuidance if guidance == "autoguidance" else ClassifierFreeGuidance
    first, first_guidance = cls.for_role(folder, 0, torch.device("cpu"), torch.float32)
    second, second_guidance = cls.for_role(folder, 1, torch.device("cpu"), torch.float32)
    # the tiny twin has 1 block, the transformer 2; CFG's two passes run the one transformer
    assert (first.config.num_layers, second.config.num_layers) == ((2, 1) if guidance == "autoguidance" else (2, 2))
    if isinstance(first_guidance, AutoGuidance) and isinstance(second_guidance, AutoGuidance):
        assert first_guidance.weak is None and second_guidance.weak is None  # no second DiT on either


@pytest.mark.parametrize("scales", [[0.75, 2.0], [0.0, 0.0]], ids=["guided", "unguided"])
@pytest.mark.parametrize("guidance", GUIDANCES)
def test_the_passes_apart_and_exchanged_give_the_sequential_velocity_exactly(
    folders: dict[str, DecoderFolder], guidance: str, scales: list[float]
) -> None:
    folder = folders[guidance]
    cls = AutoGuidance if guidance == "autoguidance" else ClassifierFreeGuidance
    main, _ = cls.for_role(folder, 0, torch.device("cpu"), torch.float32)
    twin, pair_guidance = cls.for_role(folder, 1, torch.device("cpu"), torch.float32)
    sequential: TwoPassGuidance
    if isinstance(pair_guidance, AutoGuidance):
        sequential = AutoGuidance(twin)
    else:
        assert isinstance(pair_guidance, ClassifierFreeGuidance)
        sequential = ClassifierFreeGuidance(pair_guidance.embedding, batched=False)
    shard = TokenShard(None, position_ids(8, 8))
    step = _step(main, scales)
    with torch.inference_mode():
        want = sequential.velocity(shard, main, step)
        # role 1's side: its pass, or zeros when the step has no second pass
        second = pair_guidance.second(shard, twin, step) if pair_guidance.needs_second(step) else None
        zeros = torch.zeros_like(want)
        role0 = PlayedPair(0, None, None, others=zeros if second is None else second)
        got = parallel_velocity(pair_guidance, role0, shard, main, step)
        # and role 1 ends the step with the same velocity, from role 0's prediction
        role1 = PlayedPair(1, None, None, others=pair_guidance.first(shard, main, step))
        got_on_role1 = parallel_velocity(pair_guidance, role1, shard, twin, step)
    assert torch.equal(got, want) and torch.equal(got_on_role1, want)
    # autoguidance at scale 0 skips the twin's pass, as the sequential path does; CFG never does
    assert (second is None) == (guidance == "autoguidance" and scales == [0.0, 0.0])
