"""A step's guided velocity over this rank's tokens: TokenShard (the tokens a rank holds and the
DiT run over them, Ulysses across the group), StepInputs (one step of a batch), and the
guidance classes, one per mode a checkpoint may name (layout.py: GUIDANCE_MODES):

    none          v = DiT(x)
    autoguidance  v = pred + g * (pred - weak_pred)       the weak twin (transformer2)
    cfg           v = uncond + s * (cond - uncond)        the uncond embedding in every cell

A TwoPassGuidance's two passes run one after the other (velocity), or on two groups of ranks
at once (parallel_velocity, guidance_parallel.py): the same arithmetic on the same predictions,
so the same velocity bit for bit (CFG: as its passes one after the other, batched=False; its
default batched pass of 2B rows agrees to float rounding).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from gpu_workers.attention.ulysses import SequenceShard, UlyssesAttention, gather_sequence, shard_sequence
from gpu_workers.models.flow_match import autoguidance, cfg
from gpu_workers.models.flux_dit import BlockRunner, FluxDiT, FluxDiTConfig, run_blocks
from gpu_workers.vision_decoder.guidance_parallel import GuidanceGroups
from gpu_workers.vision_decoder.layout import GUIDANCE_MODES, UNCOND_FILE, DecoderFolder
from gpu_workers.vision_decoder.step_cache import StepCache

# ---------------------------------------------------------------------------------------------
# This rank's share of a batch's tokens, and the guided velocity over it.


class TokenShard:
    """The tokens [start, stop) of a sequence of num_tokens that this rank holds (padded to
    ceil(num_tokens / world_size)); runs a DiT over them with the attention that joins the
    ranks, and gathers a sharded tensor back whole."""

    def __init__(self, group: dist.ProcessGroup | None, positions: torch.Tensor) -> None:
        self.group = group
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.num_tokens = positions.shape[0]
        self.positions = self.shard(positions, dim=0)  # (L, 3); padding at (0, 0, 0)

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return shard_sequence(x, self.rank, self.world_size, dim=dim)[0]

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        return gather_sequence(local, self.group, self.num_tokens, dim=1)  # (B, S, ...)

    @property
    def valid_tokens(self) -> int:
        """This rank's tokens that are not padding: the first valid_tokens of its L."""
        shard = SequenceShard(self.num_tokens, self.world_size, self.rank)
        return shard.stop - shard.start

    def sum_across_ranks(self, local: torch.Tensor) -> torch.Tensor:
        """A tensor of per-rank sums -> the group's sums, the same on every rank."""
        if self.world_size == 1:
            return local
        total = local.clone()
        dist.all_reduce(total, group=self.group)
        return total

    def run(
        self,
        model: FluxDiT,
        x: torch.Tensor,
        timestep: torch.Tensor,
        vec: torch.Tensor,
        blocks: BlockRunner = run_blocks,
    ) -> torch.Tensor:
        """x (B, L, token_in_dim) -> velocity (B, L, token_out_dim) float32."""
        attention = None
        if self.world_size > 1:
            heads = model.config.num_heads
            attention = UlyssesAttention(self.group, self.world_size, self.rank, self.num_tokens, heads)
        return model(x, self.positions, timestep, vec, attention=attention, blocks=blocks).float()


@dataclass(frozen=True, slots=True)
class StepInputs:
    """One denoising step of a batch, over this rank's L tokens."""

    x: torch.Tensor  # (B, L, p*p*16) the noisy latent's tokens, float32
    cond: torch.Tensor  # (B, L, cp*cp*cond) the code condition's tokens (cp: p, or 1 unpacked)
    vec: torch.Tensor  # (B, cond) the mean code embedding
    timestep: torch.Tensor  # (B,) what the DiT sees: truncated, on the 0..1000 scale
    scales: torch.Tensor  # (B,) each job's guidance scale
    guided: bool  # some scale is not 0: known from the jobs on the host, so no step reads `scales` back
    cache: StepCache | None = None  # the batch's first-block cache

    @property
    def tokens(self) -> torch.Tensor:
        return torch.cat((self.x, self.cond), dim=-1)  # (B, L, p*p*16 + cp*cp*cond)

    def blocks(self, dit_pass: str) -> BlockRunner:
        """What runs the blocks of one DiT pass of the step: each pass has its own cache memory."""
        return run_blocks if self.cache is None else self.cache.runner(dit_pass)


class Guidance(ABC):
    """How a step's velocity is made from the DiT (and whatever else the mode holds)."""

    MODE: ClassVar[str]  # the config's "guidance"

    @classmethod
    @abstractmethod
    def from_dir(cls, folder: DecoderFolder, transformer: FluxDiT, device: torch.device, dtype: torch.dtype) -> Guidance:
        """Load what the mode needs beside the DiT from the checkpoint directory."""

    @abstractmethod
    def velocity(self, shard: TokenShard, transformer: FluxDiT, step: StepInputs) -> torch.Tensor:
        """The guided velocity (B, L, p*p*16), float32."""


class Unguided(Guidance):
    MODE = "none"

    @classmethod
    def from_dir(cls, folder: DecoderFolder, transformer: FluxDiT, device: torch.device, dtype: torch.dtype) -> Unguided:
        return cls()

    def velocity(self, shard: TokenShard, transformer: FluxDiT, step: StepInputs) -> torch.Tensor:
        return shard.run(transformer, step.tokens, step.timestep, step.vec, step.blocks("main"))


class TwoPassGuidance(Guidance):
    """A guidance of two DiT passes a step, combined: run one after the other here, or on two
    groups of ranks at once (guidance_parallel.py). On a rank of guidance role r the decoder's
    transformer is the model of pass r (for_role)."""

    @classmethod
    @abstractmethod
    def for_role(
        cls, folder: DecoderFolder, role: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[FluxDiT, TwoPassGuidance]:
        """The DiT that guidance role `role` runs (only its weights are loaded) and the guidance."""

    @abstractmethod
    def first(self, shard: TokenShard, model: FluxDiT, step: StepInputs) -> torch.Tensor:
        """Pass 0's prediction (B, L, p*p*16) float32."""

    @abstractmethod
    def second(self, shard: TokenShard, model: FluxDiT, step: StepInputs) -> torch.Tensor:
        """Pass 1's prediction; model: the DiT pass 1 runs."""

    @abstractmethod
    def combine(self, first: torch.Tensor, second: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """The guided velocity from the two predictions."""

    def needs_second(self, step: StepInputs) -> bool:
        return True


class AutoGuidance(TwoPassGuidance):
    """pred + g * (pred - weak_pred): push away from a weaker model's prediction. weak: None on
    a rank of guidance parallelism, which holds one of the two models as its transformer."""

    MODE = "autoguidance"

    def __init__(self, weak: FluxDiT | None) -> None:
        self.weak = weak

    @classmethod
    def from_dir(
        cls, folder: DecoderFolder, transformer: FluxDiT, device: torch.device, dtype: torch.dtype
    ) -> AutoGuidance:
        weak = FluxDiT.from_dir(folder.weak_dir, device=device, dtype=dtype)
        _check_twin(weak.config, transformer.config)
        return cls(weak)

    @classmethod
    def for_role(
        cls, folder: DecoderFolder, role: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[FluxDiT, AutoGuidance]:
        _check_twin(FluxDiTConfig.from_dir(folder.weak_dir), FluxDiTConfig.from_dir(folder.path / "transformer"))
        model_dir = folder.path / "transformer" if role == 0 else folder.weak_dir
        return FluxDiT.from_dir(model_dir, device=device, dtype=dtype), cls(None)

    def first(self, shard: TokenShard, model: FluxDiT, step: StepInputs) -> torch.Tensor:
        return shard.run(model, step.tokens, step.timestep, step.vec, step.blocks("main"))

    def second(self, shard: TokenShard, model: FluxDiT, step: StepInputs) -> torch.Tensor:
        return shard.run(model, step.tokens, step.timestep, step.vec, step.blocks("weak"))

    def combine(self, first: torch.Tensor, second: torch.Tensor, step: StepInputs) -> torch.Tensor:
        return autoguidance(first, second, step.scales.view(-1, 1, 1))  # type: ignore[arg-type]  # (B,) scales

    def needs_second(self, step: StepInputs) -> bool:
        return step.guided  # no job asks for guidance: the weak pass would be multiplied by 0

    def velocity(self, shard: TokenShard, transformer: FluxDiT, step: StepInputs) -> torch.Tensor:
        assert self.weak is not None, "a rank of guidance parallelism runs parallel_velocity"
        pred = self.first(shard, transformer, step)
        if not self.needs_second(step):
            return pred
        return self.combine(pred, self.second(shard, self.weak, step), step)


class ClassifierFreeGuidance(TwoPassGuidance):
    """uncond + s * (cond - uncond). The unconditional pass sees the uncond embedding in every
    cell and as vec. batched: both passes as one forward of 2B rows (the default); False runs
    them one after the other (the benchmark's baseline; the results agree to float rounding).
    Guidance parallelism runs them on two groups of ranks: as batched=False, exactly."""

    MODE = "cfg"

    def __init__(self, embedding: torch.Tensor, batched: bool = True) -> None:
        self.embedding = embedding  # (cond,)
        self.batched = batched

    @classmethod
    def from_dir(
        cls, folder: DecoderFolder, transformer: FluxDiT, device: torch.device, dtype: torch.dtype
    ) -> ClassifierFreeGuidance:
        path = folder.path
        if not (path / UNCOND_FILE).is_file():
            raise ValueError(f"{path}: guidance 'cfg' needs {UNCOND_FILE}")
        embedding = load_file(path / UNCOND_FILE, device=str(device)).get("embedding")
        want = (transformer.config.cond_channels,)
        if embedding is None or tuple(embedding.shape) != want:
            got = None if embedding is None else tuple(embedding.shape)
            raise ValueError(f"{path / UNCOND_FILE}: 'embedding' of shape {want} wanted, got {got}")
        return cls(embedding.float())

    @classmethod
    def for_role(
        cls, folder: DecoderFolder, role: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[FluxDiT, ClassifierFreeGuidance]:
        transformer = FluxDiT.from_dir(folder.path / "transformer", device=device, dtype=dtype)
        return transformer, cls.from_dir(folder, transformer, device, dtype)

    def _unconditional(self, model: FluxDiT, step: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The unconditional pass's tokens (B, L, p*p*16 + cp*cp*cond) and vec (B, cond)."""
        b, s, _ = step.x.shape
        cp = model.config.condition_patch
        # a constant map patchifies to each channel's value repeated cp*cp times (channel-major)
        null_cond = self.embedding.repeat_interleave(cp * cp).expand(b, s, -1).to(step.cond.dtype)  # (B, L, cp*cp*cond)
        return torch.cat((step.x, null_cond), dim=-1), self.embedding.expand(b, -1)

    def first(self, shard: TokenShard, model: FluxDiT, step: StepInputs) -> torch.Tensor:
        return shard.run(model, step.tokens, step.timestep, step.vec, step.blocks("conditional"))

    def second(self, shard: TokenShard, model: FluxDiT, step: StepInputs) -> torch.Tensor:
        tokens, vec = self._unconditional(model, step)
        return shard.run(model, tokens, step.timestep, vec, step.blocks("unconditional"))

    def combine(self, first: torch.Tensor, second: torch.Tensor, step: StepInputs) -> torch.Tensor:
        return cfg(first, second, step.scales.view(-1, 1, 1))  # type: ignore[arg-type]  # (B,) scales

    def velocity(self, shard: TokenShard, transformer: FluxDiT, step: StepInputs) -> torch.Tensor:
        if not self.batched:
            return self.combine(self.first(shard, transformer, step), self.second(shard, transformer, step), step)
        without, null_vec = self._unconditional(transformer, step)
        tokens, timestep = torch.cat((step.tokens, without)), torch.cat((step.timestep, step.timestep))
        # rows [0, B) conditional, [B, 2B) unconditional: the cache's row r is job r % B
        vecs = torch.cat((step.vec, null_vec))
        both = shard.run(transformer, tokens, timestep, vecs, step.blocks("both"))  # (2B, L, p*p*16)
        conditional, unconditional = both.chunk(2)
        return self.combine(conditional, unconditional, step)


def parallel_velocity(
    guidance: TwoPassGuidance, groups: GuidanceGroups, shard: TokenShard, model: FluxDiT, step: StepInputs
) -> torch.Tensor:
    """A step's velocity on a rank of guidance parallelism: this rank's pass, exchanged with its
    pair's, combined as velocity() combines them. model: this rank's DiT (role 1: the twin)."""
    second = guidance.needs_second(step)
    if groups.role == 0:
        own = guidance.first(shard, model, step)
    elif second:
        own = guidance.second(shard, model, step)
    else:  # no second pass this step: role 1 idles, and its zeros are never read
        own = torch.zeros(*step.x.shape[:2], model.config.token_out_dim, device=step.x.device)
    first, other = groups.exchange(own)
    return guidance.combine(first, other, step) if second else first


GUIDANCE: dict[str, type[Guidance]] = {g.MODE: g for g in (AutoGuidance, ClassifierFreeGuidance, Unguided)}
assert set(GUIDANCE) == set(GUIDANCE_MODES), "every mode a config may name has its class"


def _check_twin(weak: FluxDiTConfig, main: FluxDiTConfig) -> None:
    fields = ("in_channels", "cond_channels", "vec_in_dim", "patch", "pack_condition")
    differ = [f for f in fields if getattr(weak, f) != getattr(main, f)]
    if differ:
        raise ValueError(f"weak_transformer differs from transformer in {', '.join(differ)}")
