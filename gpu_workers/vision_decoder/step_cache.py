"""StepCache: a first-block cache over one batch's denoising steps (FBCache's idea, our code).

At each step of each DiT pass the first block runs, and its residual (its output minus its
input) is compared with the residual it had at the row's last fully computed step:

    change = mean |r_i - r_c| / mean |r_c|     over the row's tokens (every rank's) and features
    r      = block_0(h) - h                    (B, L, hidden)
    c      = the row's last fully computed step

A row whose change is under its job's threshold skips blocks 1..n-1 and adds instead the
residual those blocks made at step c (their output minus block 0's); the other rows run them.
Comparing with step c, not the previous step, bounds the drift: a run of skipped steps ends as
soon as the first block has moved by the threshold since the blocks last ran.

    step        0    1    2 ... N-2   N-1
    policy      run  run  cache ...   run      (first_computed = 2, last_computed = 1)

What is kept, and where:
- per batch row: each job has its own threshold and its own decision (rows of a batch are
  different images); a pass of R = k*B rows (CFG's batched pass: B conditional rows, then B
  unconditional) maps row r to job r % B.
- per pass: each DiT pass of a step (the main transformer, autoguidance's weak twin, or CFG's
  passes) has its own memory, named by the guidance that runs it.
- Ulysses: a rank holds L of the tokens; the two sums of `change` are all-reduced over the
  group (padding excluded), so every rank takes the same decisions and runs the same
  collectives. The memory is sharded as the tokens are.

A batch whose thresholds are all 0 never makes a memory: its blocks run as run_blocks runs them,
so its images are byte-equal to a decoder without the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from gpu_workers.models.flux_dit import Attention, BlockRunner, Rope, SingleStreamBlock, run_blocks

# (2, R) local sums -> the same sums over every rank of the group
SumAcrossRanks = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class StepCachePolicy:
    """Steps that always run every block: the first ones (the first has nothing to compare
    with; early steps set the image's layout) and the last ones (they set its fine detail)."""

    first_computed: int = 2
    last_computed: int = 1

    def forced(self, step: int, steps: int) -> bool:
        return step < self.first_computed or step >= steps - self.last_computed


@dataclass(slots=True)
class _Memory:
    """One pass's residuals at each row's last computed step, over this rank's L tokens."""

    first: torch.Tensor  # (R, L, hidden) block 0's residual
    rest: torch.Tensor  # (R, L, hidden) blocks 1..n-1's residual


@dataclass(slots=True)
class StepCache:
    """One batch's cache. thresholds: each job's (0: always compute); steps: the batch's step
    count; valid_tokens: this rank's tokens that are not padding (the first valid_tokens of L);
    sum_across_ranks: the group's all-reduce (identity on one rank)."""

    thresholds: list[float]
    steps: int
    valid_tokens: int
    sum_across_ranks: SumAcrossRanks = torch.clone  # one rank: its sums are the group's
    policy: StepCachePolicy = field(default_factory=StepCachePolicy)
    step: int = 0
    # per job, every pass: blocks run and blocks skipped
    blocks_computed: list[int] = field(init=False)
    blocks_skipped: list[int] = field(init=False)
    _memories: dict[str, _Memory] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.blocks_computed = [0] * len(self.thresholds)
        self.blocks_skipped = [0] * len(self.thresholds)

    @property
    def on(self) -> bool:
        return any(t > 0 for t in self.thresholds)

    def runner(self, name: str) -> BlockRunner:
        """The BlockRunner of one pass (its memory is `name`'s) at the current step."""

        def run(
            blocks: Sequence[SingleStreamBlock], h: torch.Tensor, temb: torch.Tensor, rope: Rope, attention: Attention
        ) -> torch.Tensor:
            return self._run(name, blocks, h, temb, rope, attention)

        return run

    def _run(
        self,
        name: str,
        blocks: Sequence[SingleStreamBlock],
        h: torch.Tensor,
        temb: torch.Tensor,
        rope: Rope,
        attention: Attention,
    ) -> torch.Tensor:
        rows = h.shape[0]
        jobs = [r % len(self.thresholds) for r in range(rows)]
        if not self.on:
            self._count(jobs, [False] * rows, len(blocks))
            return run_blocks(blocks, h, temb, rope, attention)
        first = blocks[0](h, temb, rope, attention)  # (R, L, hidden)
        residual = first - h
        memory = self._memories.get(name)
        skip = [False] * rows
        if memory is not None and not self.policy.forced(self.step, self.steps):
            change = self._change(residual, memory.first)
            skip = [change[r] < self.thresholds[jobs[r]] for r in range(rows)]
        self._count(jobs, skip, len(blocks))
        rest = blocks[1:]
        if not any(skip):  # the whole batch, as run_blocks would run it
            out = run_blocks(rest, first, temb, rope, attention)
            self._memories[name] = _Memory(residual, out - first)
            return out
        assert memory is not None
        out = first + memory.rest  # (R, L, hidden): every row from the cache, then the computed ones
        run = [r for r in range(rows) if not skip[r]]
        if run:
            index = torch.tensor(run, device=h.device)
            # the rows that run see only each other: attention is per row, modulation per row
            computed = run_blocks(rest, first[index], temb[index], rope, attention)
            out[index] = computed
            memory.first[index] = residual[index]
            memory.rest[index] = computed - first[index]
        return out

    def _change(self, residual: torch.Tensor, previous: torch.Tensor) -> list[float]:
        """Each row's mean |residual - previous| / mean |previous| over every rank's tokens."""
        n = self.valid_tokens
        now, then = residual[:, :n].float(), previous[:, :n].float()
        sums = torch.stack(((now - then).abs().sum(dim=(1, 2)), then.abs().sum(dim=(1, 2))))  # (2, R)
        diff, base = self.sum_across_ranks(sums).tolist()  # the one host read of a step
        return [d / b if b > 0 else float("inf") for d, b in zip(diff, base)]

    def _count(self, jobs: list[int], skip: list[bool], num_blocks: int) -> None:
        for job, skipped in zip(jobs, skip):
            self.blocks_computed[job] += 1 if skipped else num_blocks
            self.blocks_skipped[job] += num_blocks - 1 if skipped else 0
