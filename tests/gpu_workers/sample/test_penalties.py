"""PenaltyCounts: counts kept across steps equal a from-scratch count of each history."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from gpu_workers.sample.penalties import PenaltyCounts
from gpu_workers.sample.sampler import _to_device


@dataclass
class History:
    token_ids: list[int]
    num_prompt_tokens: int


def check(counts: PenaltyCounts, live: dict[str, History], vocab: int) -> None:
    keys = sorted(live)
    seen, out = counts.rows(torch.tensor([counts.slots[k] for k in keys]))
    for j, k in enumerate(keys):
        h = live[k]
        want = Counter(h.token_ids[h.num_prompt_tokens :])
        assert out[j].tolist() == [float(want[t]) for t in range(vocab)], k
        assert seen[j].nonzero().flatten().tolist() == sorted(set(h.token_ids)), k


def test_kept_counts_equal_a_recount_as_requests_grow_leave_and_arrive() -> None:
    vocab = 40
    g = torch.Generator().manual_seed(1)
    counts = PenaltyCounts()
    live: dict[str, History] = {}
    for step in range(40):
        if step % 3 == 0:  # arrivals beyond the first capacity (8): the tensors grow
            for k in range(4):
                live[f"{step}.{k}"] = History(torch.randint(0, vocab, (3 + k,), generator=g).tolist(), 3 + k)
        if step % 4 == 3:  # leavers free their slots for later arrivals
            for key in sorted(live)[:2]:
                del live[key]
                counts.release(key)
        keys = sorted(live)
        plan = counts.plan(keys, [live[k] for k in keys])
        counts.update(_to_device({k: v for k, v in plan.items()}, torch.device("cpu")), vocab, torch.float32)
        check(counts, live, vocab)
        for h in live.values():  # each samples one token, some two (a step that was missed)
            h.token_ids += torch.randint(0, vocab, (1 + step % 2,), generator=g).tolist()
    assert len(counts) == len(live)
    assert len(counts.slots) <= counts._capacity


def test_a_history_shorter_than_counted_is_counted_again() -> None:
    counts = PenaltyCounts()
    plan = counts.plan(["a"], [History([1, 2, 3, 3], 2)])
    counts.update(_to_device(plan, torch.device("cpu")), 8, torch.float32)
    plan = counts.plan(["a"], [History([5, 5], 1)])  # not the history the slot counted
    counts.update(_to_device(plan, torch.device("cpu")), 8, torch.float32)
    check(counts, {"a": History([5, 5], 1)}, 8)
