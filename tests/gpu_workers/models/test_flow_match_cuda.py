"""The flow-matching sampler's noise on a GPU, in a file of its own: test_flow_match.py imports
diffusers (its reference), which the lent GPU machine lacks (bench/gpu_smoke.sh)."""

from __future__ import annotations

import pytest
import torch

from gpu_workers.models.flow_match import initial_noise


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_initial_noise_is_the_same_on_a_gpu() -> None:
    cpu = initial_noise((1, 16, 96, 96), seed=42)
    gpu = initial_noise((1, 16, 96, 96), seed=42, device="cuda")
    assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)
