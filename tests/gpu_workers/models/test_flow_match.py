"""The sampler against diffusers' FlowMatchEulerDiscreteScheduler, the reference's own."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift as flux_calculate_shift

from gpu_workers.models.flow_match import (
    DEFAULT_STEPS,
    FlowMatchSchedule,
    autoguidance,
    calculate_shift,
    cfg,
    euler_step,
    initial_noise,
)

# black-forest-labs/FLUX.1-dev scheduler/scheduler_config.json
FLUX_SCHEDULER = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.30.0.dev0",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}


def _pair(config: dict[str, Any]) -> tuple[FlowMatchSchedule, Any]:
    # Any: diffusers' config decorators hide the scheduler's attributes from mypy
    return FlowMatchSchedule.from_config(config), FlowMatchEulerDiscreteScheduler.from_config(config)


@pytest.mark.parametrize("num_steps", [1, 2, 25, 50])
@pytest.mark.parametrize("shift", [1.0, 3.0, 0.5, 1.7])
def test_static_shift_sigmas_and_timesteps_are_diffusers_bit_for_bit(num_steps: int, shift: float) -> None:
    ours, theirs = _pair({"shift": shift})
    theirs.set_timesteps(num_steps)
    # exact, not close: a timestep one ulp under an integer truncates differently
    assert torch.equal(ours.sigmas(num_steps), theirs.sigmas)
    assert torch.equal(ours.timesteps(num_steps), theirs.timesteps)
    assert ours.sigmas(num_steps).dtype == torch.float32 and ours.sigmas(num_steps)[-1] == 0


def test_num_train_timesteps_other_than_1000() -> None:
    ours, theirs = _pair({"shift": 2.0, "num_train_timesteps": 700})
    theirs.set_timesteps(25)
    assert torch.equal(ours.timesteps(25), theirs.timesteps)
    assert torch.equal(ours.sigmas(25), theirs.sigmas)


@pytest.mark.parametrize("num_steps", [25, 50])
@pytest.mark.parametrize("mu", [0.5, 1.15, 0.8234, 2.0])
@pytest.mark.parametrize("time_shift_type", ["exponential", "linear"])
def test_dynamic_shift_with_mu(num_steps: int, mu: float, time_shift_type: str) -> None:
    ours, theirs = _pair({**FLUX_SCHEDULER, "time_shift_type": time_shift_type})
    theirs.set_timesteps(num_steps, mu=mu)
    assert torch.equal(ours.sigmas(num_steps, mu=mu), theirs.sigmas)
    assert torch.equal(ours.timesteps(num_steps, mu=mu), theirs.timesteps)


@pytest.mark.parametrize("image_seq_len", [256, 2304, 4096, 9216, 300])
def test_dynamic_shift_from_the_image_token_count(image_seq_len: int) -> None:
    ours, theirs = _pair(FLUX_SCHEDULER)
    mu = flux_calculate_shift(
        image_seq_len,
        theirs.config.get("base_image_seq_len", 256),
        theirs.config.get("max_image_seq_len", 4096),
        theirs.config.get("base_shift", 0.5),
        theirs.config.get("max_shift", 1.15),
    )
    assert ours.mu(image_seq_len) == mu == calculate_shift(image_seq_len)
    theirs.set_timesteps(DEFAULT_STEPS, mu=mu)
    assert torch.equal(ours.sigmas(image_seq_len=image_seq_len), theirs.sigmas)
    with pytest.raises(ValueError, match="image_seq_len"):
        ours.sigmas(25)


def test_static_shift_ignores_the_token_count() -> None:
    ours = FlowMatchSchedule.from_config({"shift": 3.0})
    assert torch.equal(ours.sigmas(25, image_seq_len=9216), ours.sigmas(25))


@pytest.mark.parametrize("shift_terminal", [0.1, 0.02])
def test_shift_terminal(shift_terminal: float) -> None:
    ours, theirs = _pair({"shift": 3.0, "shift_terminal": shift_terminal})
    theirs.set_timesteps(25)
    assert torch.equal(ours.sigmas(25), theirs.sigmas)
    assert abs(ours.sigmas(25)[-2].item() - shift_terminal) < 1e-6


@pytest.mark.parametrize("config", [{"shift": 1.0}, {"shift": 3.0}, FLUX_SCHEDULER])
def test_model_timesteps_are_the_references_truncation(config: dict[str, Any]) -> None:
    ours, theirs = _pair(config)
    mu = 1.0 if config.get("use_dynamic_shifting") else None
    for n in (25, 50):
        theirs.set_timesteps(n, mu=mu)
        # what the reference does per step: torch.full((B,), t.item(), dtype=torch.long)
        want = torch.cat([torch.full((1,), t.item(), dtype=torch.long) for t in theirs.timesteps])
        got = ours.model_timesteps(n, mu=mu)
        assert got.dtype == torch.int64 and torch.equal(got, want)
        assert torch.equal(ours.model_sigmas(n, mu=mu), want.float() / 1000)
        # truncation, not rounding: the first timestep is exactly 1000, the rest fall below
        assert got[0] == 1000 and bool((got.float() <= theirs.timesteps).all())


def _toy_velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    # depends on both the state and the (integer) time the model is told, t (B,)
    t = t.float().view(-1, 1, 1, 1)
    return torch.sin(3 * x) * (t / 1000) - 0.3 * x + torch.cos(t / 77)


@pytest.mark.parametrize(("config", "num_steps"), [({"shift": 3.0}, 25), ({"shift": 1.0}, 50), (FLUX_SCHEDULER, 25)])
def test_euler_loop_matches_the_diffusers_step_loop(config: dict[str, Any], num_steps: int) -> None:
    ours, theirs = _pair(config)
    mu = 0.9 if config.get("use_dynamic_shifting") else None
    x0 = initial_noise((2, 16, 6, 5), seed=7)

    # the reference's loop: diffusers' step, the model fed the truncated timestep
    theirs.set_timesteps(num_steps, mu=mu)
    x_ref = x0.clone()
    for t in theirs.timesteps:
        v = _toy_velocity(x_ref, torch.full((2,), t.item(), dtype=torch.long))
        x_ref = theirs.step(v, t, x_ref).prev_sample

    sigmas, steps = ours.sigmas(num_steps, mu=mu), ours.model_timesteps(num_steps, mu=mu)
    x = x0.clone()
    for i in range(num_steps):
        x = euler_step(x, _toy_velocity(x, steps[i].expand(2)), sigmas[i], sigmas[i + 1])
    diff = (x - x_ref).abs().max().item()
    assert diff < 1e-5, diff
    assert diff == 0.0  # the same float32 operations: exact in practice


def test_euler_step_per_row_sigmas() -> None:
    x, v = torch.randn(3, 4, 2, 2), torch.randn(3, 4, 2, 2)
    sigma, sigma_next = torch.tensor([1.0, 0.5, 0.25]), torch.tensor([0.75, 0.25, 0.0])
    out = euler_step(x, v, sigma, sigma_next)
    for b in range(3):
        assert torch.equal(out[b], euler_step(x[b], v[b], sigma[b], sigma_next[b]))
    assert torch.equal(euler_step(x, v, 0.5, 0.25), x - 0.25 * v)


def test_euler_step_computes_in_float32_and_returns_the_velocity_dtype() -> None:
    x = torch.randn(1, 4, 3, 3).bfloat16()
    v = torch.randn(1, 4, 3, 3).bfloat16()
    out = euler_step(x, v, torch.tensor(0.9), torch.tensor(0.8))
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (x.float() + (torch.tensor(0.8) - torch.tensor(0.9)) * v.float()).bfloat16())


def test_guidance_combiners() -> None:
    pred, weak = torch.tensor([1.0, 2.0, -1.0]), torch.tensor([0.5, 2.0, 1.0])
    assert torch.equal(autoguidance(pred, weak), pred + 0.75 * (pred - weak))  # the reference's default g
    assert torch.equal(autoguidance(pred, weak, 0.0), pred)
    assert torch.equal(autoguidance(pred, weak, 2.0), torch.tensor([2.0, 2.0, -5.0]))
    cond, uncond = torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0])
    assert torch.equal(cfg(cond, uncond, 1.0), cond)
    assert torch.equal(cfg(cond, uncond, 0.0), uncond)
    assert torch.equal(cfg(cond, uncond, 4.0), torch.tensor([4.0, 9.0]))


def test_initial_noise_is_a_cpu_draw_for_the_seed() -> None:
    a = initial_noise((1, 16, 4, 6), seed=1234)
    assert torch.equal(a, initial_noise((1, 16, 4, 6), seed=1234))
    assert torch.equal(a, torch.randn((1, 16, 4, 6), generator=torch.Generator().manual_seed(1234)))
    assert not torch.equal(a, initial_noise((1, 16, 4, 6), seed=1235))
    # other draws in the process do not move it (each call has its own generator)
    torch.manual_seed(0)
    torch.randn(100)
    assert torch.equal(a, initial_noise((1, 16, 4, 6), seed=1234))
    half = initial_noise((1, 16, 4, 6), seed=1234, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and torch.equal(half, a.bfloat16())
    assert initial_noise((2,), seed=2**64 - 1).shape == (2,)


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, True, "7"])
def test_initial_noise_bad_seed(seed: Any) -> None:
    with pytest.raises(ValueError, match="seed"):
        initial_noise((2,), seed=seed)


def test_from_config_reads_the_flux_file_and_ignores_bookkeeping_keys() -> None:
    s = FlowMatchSchedule.from_config(FLUX_SCHEDULER)
    assert s == FlowMatchSchedule(shift=3.0, use_dynamic_shifting=True)
    assert FlowMatchSchedule.from_config({}) == FlowMatchSchedule()
    # diffusers allows null shifts; they fall back to its defaults
    assert FlowMatchSchedule.from_config({"base_shift": None, "max_shift": None}) == FlowMatchSchedule()


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"_class_name": "EulerDiscreteScheduler"}, "_class_name"),
        ({"use_karras_sigmas": True}, "use_karras_sigmas"),
        ({"stochastic_sampling": True, "invert_sigmas": True}, "invert_sigmas, stochastic_sampling"),
        ({"shift": 0}, "shift"),
        ({"shift": "3"}, "shift"),
        ({"num_train_timesteps": 0}, "num_train_timesteps"),
        ({"time_shift_type": "cosine"}, "time_shift_type"),
        ({"shift_terminal": 1.0}, "shift_terminal"),
        ({"base_image_seq_len": 4096}, "both 4096"),
    ],
)
def test_from_config_rejects(config: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FlowMatchSchedule.from_config(config)


@pytest.mark.parametrize("num_steps", [0, -1, 2.0, True])
def test_bad_step_counts(num_steps: Any) -> None:
    with pytest.raises(ValueError, match="num_steps"):
        FlowMatchSchedule().sigmas(num_steps)
