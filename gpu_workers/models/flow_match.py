"""Flow-matching Euler sampling, as the reference's image decoder runs it.

The reference builds diffusers' FlowMatchEulerDiscreteScheduler from the checkpoint's
scheduler_config.json, calls set_timesteps(num_steps) and then, per step i:

    t_i     = timesteps[i]                  float32, = sigmas[i] * num_train_timesteps
    model   <- int(t_i) / num_train_timesteps   the DiT sees t TRUNCATED to an integer
    x       <- x + (sigmas[i+1] - sigmas[i]) * v    the step uses the exact sigmas

so FlowMatchSchedule reproduces set_timesteps bit for bit (same float64 arithmetic, same cast
to float32: a timestep one float32 ulp under an integer truncates to the integer below, so
"close" is not enough), and model_timesteps gives the truncated integers.

    index   0        1       ...   N-1        N
    sigmas  s_0=1    s_1     ...   s_{N-1}    0      (N + 1 values, the last appended)
    steps   [0 -> 1] [1 -> 2] ...  [N-1 -> N]        (N Euler steps, step i uses s_i, s_{i+1})

Dynamic shifting (resolution-dependent, Flux's "mu") is supported when the config asks for
it: mu comes from the image's token count by calculate_shift, as FluxPipeline computes it,
and the sigmas are then what set_timesteps(num_steps, mu=mu) makes. (FluxPipeline also
passes its own sigmas, linspace(1, 1/N, N); the reference passes none, so neither do we.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

DEFAULT_STEPS = 25
DEFAULT_AUTOGUIDANCE = 0.75
_SCHEDULER_CLASS = "FlowMatchEulerDiscreteScheduler"
# options of the diffusers scheduler that change the sigmas or the step; refused when set
_UNSUPPORTED = (
    "use_karras_sigmas",
    "use_exponential_sigmas",
    "use_beta_sigmas",
    "invert_sigmas",
    "stochastic_sampling",
)
_TIME_SHIFTS = ("exponential", "linear")


def calculate_shift(
    image_seq_len: int,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> float:
    """Flux's mu: linear in the image's token count, base_shift at base_seq_len tokens and
    max_shift at max_seq_len (extrapolated beyond both)."""
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * slope + (base_shift - slope * base_seq_len)


@dataclass(frozen=True, slots=True)
class FlowMatchSchedule:
    # defaults are diffusers' FlowMatchEulerDiscreteScheduler defaults
    num_train_timesteps: int = 1000
    shift: float = 1.0
    use_dynamic_shifting: bool = False
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    time_shift_type: str = "exponential"
    shift_terminal: float | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> FlowMatchSchedule:
        """Read a diffusers scheduler_config.json dict (unknown keys are ignored)."""
        if not isinstance(config, Mapping):
            raise ValueError(f"scheduler config must be a dict, got {type(config).__name__}")  # noqa: TRY004
        name = config.get("_class_name", _SCHEDULER_CLASS)
        if name != _SCHEDULER_CLASS:
            raise ValueError(f"scheduler config: _class_name {name!r} is not {_SCHEDULER_CLASS}")
        on = [k for k in _UNSUPPORTED if config.get(k)]
        if on:
            raise ValueError(f"scheduler config: {', '.join(on)} not supported")
        d = cls()

        def number(key: str, default: float, positive: bool = True) -> float:
            value = config.get(key, default)
            if value is None:
                value = default  # diffusers allows null base/max_shift; they only matter with mu
            if not isinstance(value, int | float) or isinstance(value, bool) or (positive and value <= 0):
                raise ValueError(f"scheduler config: {key} must be a positive number, got {value!r}")
            return float(value)

        def count(key: str, default: int) -> int:
            value = config.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"scheduler config: {key} must be a positive int, got {value!r}")
            return value

        time_shift = config.get("time_shift_type", d.time_shift_type)
        if time_shift not in _TIME_SHIFTS:
            raise ValueError(f"scheduler config: time_shift_type {time_shift!r} is not {' or '.join(_TIME_SHIFTS)}")
        terminal = config.get("shift_terminal")
        bad_terminal = isinstance(terminal, bool) or not isinstance(terminal, int | float) or not 0 <= terminal < 1
        if terminal is not None and bad_terminal:
            raise ValueError(f"scheduler config: shift_terminal must be in [0, 1), got {terminal!r}")
        base_len = count("base_image_seq_len", d.base_image_seq_len)
        max_len = count("max_image_seq_len", d.max_image_seq_len)
        if base_len == max_len:
            raise ValueError(f"scheduler config: base_image_seq_len and max_image_seq_len are both {base_len}")
        return cls(
            num_train_timesteps=count("num_train_timesteps", d.num_train_timesteps),
            shift=number("shift", d.shift),
            use_dynamic_shifting=bool(config.get("use_dynamic_shifting", False)),
            base_shift=number("base_shift", d.base_shift, positive=False),
            max_shift=number("max_shift", d.max_shift, positive=False),
            base_image_seq_len=base_len,
            max_image_seq_len=max_len,
            time_shift_type=time_shift,
            # diffusers tests `if shift_terminal:`, so 0 means off as None does
            shift_terminal=float(terminal) if terminal else None,
        )

    def mu(self, image_seq_len: int) -> float:
        return calculate_shift(
            image_seq_len, self.base_image_seq_len, self.max_image_seq_len, self.base_shift, self.max_shift
        )

    def sigmas(
        self, num_steps: int = DEFAULT_STEPS, image_seq_len: int | None = None, mu: float | None = None
    ) -> torch.Tensor:
        """(num_steps + 1,) float32, from 1 down to the appended 0: scheduler.sigmas after
        set_timesteps(num_steps, mu=mu). With dynamic shifting, mu (if not given) comes from
        image_seq_len, the DiT's token count; without it both are ignored."""
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
        n = self.num_train_timesteps
        sigma_max, sigma_min = self._train_sigma_range()
        # float64 from here to the cast, as diffusers computes it in numpy
        sigmas = np.linspace(sigma_max * n, sigma_min * n, num_steps) / n
        if self.use_dynamic_shifting:
            if mu is None:
                if image_seq_len is None:
                    raise ValueError("dynamic shifting needs image_seq_len (or mu)")
                mu = self.mu(image_seq_len)
            sigmas = self._time_shift(mu, sigmas)
        else:
            sigmas = self.shift * sigmas / (1 + (self.shift - 1) * sigmas)
        if self.shift_terminal:
            # stretch so the last sigma lands on shift_terminal: scale (1 - s) by a constant
            one_minus = 1 - sigmas
            sigmas = 1 - one_minus / (one_minus[-1] / (1 - self.shift_terminal))
        out = torch.from_numpy(sigmas).to(torch.float32)
        return torch.cat([out, torch.zeros(1)])

    def timesteps(
        self, num_steps: int = DEFAULT_STEPS, image_seq_len: int | None = None, mu: float | None = None
    ) -> torch.Tensor:
        """(num_steps,) float32: scheduler.timesteps, sigmas * num_train_timesteps."""
        return self.sigmas(num_steps, image_seq_len, mu)[:-1] * self.num_train_timesteps

    def model_timesteps(
        self, num_steps: int = DEFAULT_STEPS, image_seq_len: int | None = None, mu: float | None = None
    ) -> torch.Tensor:
        """(num_steps,) int64: the timesteps truncated toward zero, as the reference feeds its
        DiT (torch.full(..., t.item(), dtype=torch.long)); 999.99994 becomes 999."""
        return self.timesteps(num_steps, image_seq_len, mu).to(torch.int64)

    def model_sigmas(
        self, num_steps: int = DEFAULT_STEPS, image_seq_len: int | None = None, mu: float | None = None
    ) -> torch.Tensor:
        """(num_steps,) float32: what the reference's DiT takes as its time input,
        model_timesteps / num_train_timesteps (its timestep embedding multiplies by 1000 again)."""
        return self.model_timesteps(num_steps, image_seq_len, mu).to(torch.float32) / self.num_train_timesteps

    def _train_sigma_range(self) -> tuple[float, float]:
        # The scheduler's training sigmas are t/n for t = n .. 1 in float32, statically shifted
        # when dynamic shifting is off; set_timesteps then spaces from the first to the last of
        # them and shifts AGAIN. The double shift of the end point is diffusers' behaviour.
        n = self.num_train_timesteps
        ends = torch.tensor([float(n), 1.0], dtype=torch.float32) / n
        if not self.use_dynamic_shifting:
            ends = self.shift * ends / (1 + (self.shift - 1) * ends)
        return ends[0].item(), ends[1].item()

    def _time_shift(self, mu: float, t: np.ndarray) -> np.ndarray:
        # diffusers' time_shift(mu, sigma=1.0, t); the power 1.0 is the identity
        if self.time_shift_type == "exponential":
            return math.exp(mu) / (math.exp(mu) + (1 / t - 1))
        return mu / (mu + (1 / t - 1))


def euler_step(
    x: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor | float, sigma_next: torch.Tensor | float
) -> torch.Tensor:
    """x + (sigma_next - sigma) * v, in float32, returned in v's dtype (as diffusers' step does).

    sigma and sigma_next are scalars or (B,) tensors (one per batch row, for a batch whose jobs
    are at different steps); pass the float32 values of FlowMatchSchedule.sigmas, never the
    truncated model timesteps."""
    s = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
    s_next = torch.as_tensor(sigma_next, dtype=torch.float32, device=x.device)
    dt = s_next - s
    if dt.dim() == 1:
        dt = dt.view(-1, *([1] * (x.dim() - 1)))  # (B, 1, ..., 1)
    return (x.float() + dt * v.float()).to(v.dtype)


def autoguidance(pred: torch.Tensor, weak_pred: torch.Tensor, g: float = DEFAULT_AUTOGUIDANCE) -> torch.Tensor:
    """The reference's autoguidance: push away from a weaker model's prediction."""
    return pred + g * (pred - weak_pred)


def cfg(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance; scale 1 is the conditional prediction."""
    return uncond + scale * (cond - uncond)


def initial_noise(
    shape: Sequence[int], seed: int, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Standard normal noise of `shape` from `seed`, the same on every device.

    Drawn on the CPU in float32 from its own torch.Generator, then moved and cast: CUDA's
    generator (Philox) and the CPU's (Mersenne Twister) give different streams for one seed, and
    drawing in bf16 differs from rounding float32 draws, so a device-side draw would make an
    image depend on where it ran. A fresh generator per call keeps a job's noise independent of
    which jobs share its batch and of how many Ulysses ranks hold its tokens (each rank draws
    the whole latent and keeps its shard). The reference drew on the GPU, so its images for a
    seed are not reproduced; ours are reproducible everywhere. The cost is a CPU draw and copy
    of 16 x 96 x 96 floats for a 768 x 768 image.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    noise = torch.randn(tuple(shape), generator=generator, dtype=torch.float32)
    return noise.to(device=device, dtype=dtype)
