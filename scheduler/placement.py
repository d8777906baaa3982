"""Placement: which LLM worker of a model's pool takes a new request.

The server process owns every worker's block manager, so the prefix-cache signal is exact:
the number of the request's leading blocks each worker holds right now (plus the leading
blocks of requests already placed there and not yet computed). Weighted scorers, each in
[0, 1], add up; the highest total wins and ties are broken at random. A hot-spot guard
overrides the scores when the chosen worker is far busier than the idlest one, so a popular
prefix cannot pile every request onto one worker.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

PREFILL_WEIGHT = 4


@dataclass(frozen=True, slots=True)
class WorkerState:
    """What placement knows about one worker for one request."""

    worker_id: int
    num_waiting: int
    num_running: int
    # Fraction of KV blocks holding KV, 0..1: in use, or free but still cached. Counting the
    # cached ones steers a new prefix to the worker with room to keep it, which spreads the
    # groups of a shared-prefix load instead of letting one worker's cache thrash.
    kv_usage: float
    num_cached_blocks: int  # the request's leading full blocks already on this worker
    num_prefilling: int = 0  # running requests without their first token yet

    @property
    def load(self) -> int:
        # Requests without their first token (waiting, or running a prefill) weigh
        # PREFILL_WEIGHT, decodes 1: a newcomer's first token waits for the prefills ahead
        # of it, hardly for decodes. Counting requests alone lets a closed-loop client's
        # arrivals follow its completions onto one worker, whose prefills then queue back
        # to back while the other worker only decodes.
        decoding = self.num_running - self.num_prefilling
        return decoding + PREFILL_WEIGHT * (self.num_waiting + self.num_prefilling)

    @property
    def num_requests(self) -> int:
        return self.num_waiting + self.num_running


@dataclass(frozen=True, slots=True)
class Decision:
    worker_id: int
    reason: str  # "prefix" | "load" | "tie" | "hotspot" | "round_robin" | "least_loaded" | "only"
    scores: tuple[float, ...] = ()


class Scorer(ABC):
    name: ClassVar[str]

    @abstractmethod
    def score(self, workers: Sequence[WorkerState], num_prompt_blocks: int) -> list[float]:
        """One score in [0, 1] per worker; higher is better."""


class PrefixCacheScorer(Scorer):
    name = "prefix"

    def score(self, workers: Sequence[WorkerState], num_prompt_blocks: int) -> list[float]:
        if num_prompt_blocks == 0:
            return [0.0] * len(workers)
        return [min(w.num_cached_blocks, num_prompt_blocks) / num_prompt_blocks for w in workers]


class QueueScorer(Scorer):
    name = "queue"

    def score(self, workers: Sequence[WorkerState], num_prompt_blocks: int) -> list[float]:
        loads = [w.load for w in workers]
        low, high = min(loads), max(loads)
        if high == low:
            return [1.0] * len(workers)
        # min-max normalised, inverted: the idlest worker scores 1, the busiest 0
        return [(high - load) / (high - low) for load in loads]


class KVUtilizationScorer(Scorer):
    name = "kv"

    def score(self, workers: Sequence[WorkerState], num_prompt_blocks: int) -> list[float]:
        return [1.0 - min(max(w.kv_usage, 0.0), 1.0) for w in workers]


SCORERS: dict[str, type[Scorer]] = {
    cls.name: cls for cls in (PrefixCacheScorer, QueueScorer, KVUtilizationScorer)
}
DEFAULT_WEIGHTS: dict[str, float] = {"prefix": 3.0, "queue": 2.0, "kv": 2.0}


def parse_weights(text: str) -> dict[str, float]:
    """'prefix=3,queue=2,kv=2' -> {'prefix': 3.0, ...}; names not given keep their default."""
    weights = dict(DEFAULT_WEIGHTS)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in SCORERS:
            raise ValueError(f"bad placement weight {item!r}; names: {', '.join(SCORERS)}")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"bad placement weight {item!r}: not a number") from None
        if weight < 0:
            raise ValueError(f"bad placement weight {item!r}: must be >= 0")
        weights[name.strip()] = weight
    return weights


@dataclass(frozen=True, slots=True)
class HotspotGuard:
    """Send to the idlest worker when the chosen one holds more requests by both margins.

    It counts requests, not the prefill-weighted load: a few prefills in flight on the worker
    that holds a prefix must not push that prefix's next request onto a cold worker.
    """

    min_extra_requests: int = 8  # chosen's requests - idlest's must exceed this ...
    min_ratio: float = 2.0  # ... and chosen's must exceed ratio * idlest's

    def overrides(self, chosen: WorkerState, idlest: WorkerState) -> bool:
        return (
            chosen.num_requests - idlest.num_requests > self.min_extra_requests
            and chosen.num_requests > self.min_ratio * idlest.num_requests
        )


class Placement(ABC):
    name: ClassVar[str]

    @abstractmethod
    def choose(self, workers: Sequence[WorkerState], num_prompt_blocks: int) -> Decision:
        """Pick among live workers only (callers pass only those); at least one is given."""


@dataclass
class PrefixAwarePlacement(Placement):
    name: ClassVar[str] = "prefix-aware"
    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    guard: HotspotGuard = field(default_factory=HotspotGuard)
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self._scorers = [(SCORERS[n](), w) for n, w in self.weights.items() if w > 0]

    def choose(self, workers: Sequence[WorkerState], num_prompt_blocks: int) -> Decision:
        if len(workers) == 1:
            return Decision(workers[0].worker_id, "only")
        totals = [0.0] * len(workers)
        for scorer, weight in self._scorers:
            for i, s in enumerate(scorer.score(workers, num_prompt_blocks)):
                totals[i] += weight * s
        best = max(totals)
        # exact float ties only happen between workers that look the same to every scorer
        tied = [i for i, t in enumerate(totals) if t >= best - 1e-9]
        pick = tied[0] if len(tied) == 1 else self.rng.choice(tied)
        chosen = workers[pick]
        idlest = min(workers, key=lambda w: w.num_requests)
        if idlest is not chosen and self.guard.overrides(chosen, idlest):
            return Decision(idlest.worker_id, "hotspot", tuple(totals))
        if len(tied) > 1:
            reason = "tie"
        elif chosen.num_cached_blocks > 0 and chosen.num_cached_blocks == max(
            w.num_cached_blocks for w in workers
        ):
            reason = "prefix"
        else:
            reason = "load"
        return Decision(chosen.worker_id, reason, tuple(totals))


@dataclass
class RoundRobinPlacement(Placement):
    name: ClassVar[str] = "round-robin"
    _next: int = 0

    def choose(self, workers: Sequence[WorkerState], num_prompt_blocks: int) -> Decision:
        # Cycle over worker ids, skipping any that are not offered (down).
        ids = sorted(w.worker_id for w in workers)
        pick = next((i for i in ids if i >= self._next), ids[0])
        self._next = pick + 1
        return Decision(pick, "round_robin")


@dataclass
class LeastLoadedPlacement(Placement):
    name: ClassVar[str] = "least-loaded"
    rng: random.Random = field(default_factory=random.Random)

    def choose(self, workers: Sequence[WorkerState], num_prompt_blocks: int) -> Decision:
        low = min(w.load for w in workers)
        tied = [w for w in workers if w.load == low]
        return Decision(self.rng.choice(tied).worker_id, "least_loaded")


POLICIES: dict[str, type[Placement]] = {
    cls.name: cls for cls in (PrefixAwarePlacement, RoundRobinPlacement, LeastLoadedPlacement)
}


def make_placement(
    policy: str, weights: dict[str, float] | None = None, seed: int | None = None
) -> Placement:
    if policy not in POLICIES:
        raise ValueError(f"unknown placement {policy!r}; choose from {', '.join(POLICIES)}")
    if policy == PrefixAwarePlacement.name:
        return PrefixAwarePlacement(weights=dict(weights or DEFAULT_WEIGHTS), rng=random.Random(seed))
    if policy == LeastLoadedPlacement.name:
        return LeastLoadedPlacement(rng=random.Random(seed))
    return RoundRobinPlacement()
