"""Sampled requests with drafts keep the target distribution: 20,000 draws of the next three
tokens of a fixed chain, through the worker's sampler and its acceptance (drafts.emitted), with
drafts that are often wrong, against the exact joint distribution computed here in numpy from
the sampling fields' definitions. The plain path (no drafts) is held to the same test."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from gpu_workers.sample.sampler import Sampler
from gpu_workers.spec.drafts import emitted
from omni.shared.protocol import SamplingOptions

V = 6  # vocabulary
NEW = 3  # tokens drawn per sequence
SAMPLES = 20_000
PROMPT = [2]
# Next-token logits given the previous token: a fixed chain, far from uniform.
CHAIN = np.array(
    [
        [2.0, 0.5, -1.0, 1.0, 0.0, -0.5],
        [0.0, 1.5, 1.0, -2.0, 0.5, 0.3],
        [1.0, 0.2, 0.1, 1.4, -1.0, 0.9],
        [-0.5, 1.0, 2.0, 0.0, 0.4, -1.5],
        [0.3, -0.35, 0.8, 0.6, 1.2, 0.05],
        [1.1, 0.0, -0.7, 0.2, 0.9, 1.6],
    ],
    dtype=np.float64,
)
OPTIONS = SamplingOptions(
    temperature=0.8, top_k=5, presence_penalty=0.6, logit_bias_token_ids=[4], logit_bias_values=[0.7], speculate=True
)


def target_step(history: list[int]) -> np.ndarray:
    """The next token's distribution after `history` (prompt + output), from the fields'
    definitions: logit_bias and the presence penalty on the raw logits, then temperature,
    then the top 5 kept."""
    logits = CHAIN[history[-1]].copy()
    logits[4] += 0.7
    for t in set(history[len(PROMPT) :]):
        logits[t] -= 0.6
    logits /= 0.8
    logits[np.argsort(-logits, kind="stable")[5:]] = -np.inf
    p = np.exp(logits - logits.max())
    return p / p.sum()


def target_joint() -> dict[tuple[int, ...], float]:
    joint = {}
    for path in itertools.product(range(V), repeat=NEW):
        p, history = 1.0, list(PROMPT)
        for t in path:
            p *= target_step(history)[t]
            history.append(t)
        joint[path] = p
    return joint


def draft_for(tokens: list[int]) -> list[int]:
    """A fixed draft that is often wrong: the raw chain's second likeliest next token, then
    the likeliest after that one."""
    second = int(np.argsort(-CHAIN[tokens[-1]])[1])
    return [second, int(np.argmax(CHAIN[second]))]


@dataclass
class Chain:
    """One sequence being drawn: what drafts.emitted reads and appends to."""

    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingOptions
    draft: list[int] = field(default_factory=list)


def draw(speculate: bool) -> tuple[list[tuple[int, ...]], int, int]:
    """SAMPLES sequences of NEW tokens, each step sampling every row of every live sequence
    in one call as the runner does; returns the paths, drafts proposed and drafts accepted."""
    torch.manual_seed(1234)
    sampler = Sampler()
    live = {f"s{i}": Chain(list(PROMPT), len(PROMPT), OPTIONS) for i in range(SAMPLES)}
    done: list[Chain] = []
    proposed = accepted = 0
    while live:
        ids, states, histories, pending, rows = [], [], [], [], []
        for rid, seq in live.items():
            left = NEW - (len(seq.token_ids) - len(PROMPT))
            seq.draft = draft_for(seq.token_ids)[: left - 1] if speculate else []
            for j in range(1 + len(seq.draft)):
                ids.append(rid)
                states.append(seq)
                histories.append(seq)
                pending.append(seq.draft[:j])
                rows.append(CHAIN[(seq.token_ids + seq.draft[:j])[-1]])
        logits = torch.tensor(np.array(rows), dtype=torch.float32)
        outputs = sampler.sample(logits, [OPTIONS] * len(ids), [None] * len(ids), histories, request_ids=ids, pending=pending)
        before = {rid: len(seq.token_ids) for rid, seq in live.items()}
        emitted(ids, states, outputs)
        for rid, seq in list(live.items()):
            proposed += len(seq.draft)
            accepted += len(seq.token_ids) - before[rid] - 1
            if len(seq.token_ids) - len(PROMPT) >= NEW:
                sampler.release(rid)
                done.append(live.pop(rid))
    return [tuple(seq.token_ids[len(PROMPT) :]) for seq in done], proposed, accepted


@pytest.mark.parametrize("speculate", [False, True])
def test_sampled_output_keeps_the_target_distribution(speculate: bool) -> None:
    paths, proposed, accepted = draw(speculate)
    assert len(paths) == SAMPLES and all(len(p) == NEW for p in paths)
    if speculate:
        assert proposed > SAMPLES  # every sequence verified drafts
        assert 0.05 < accepted / proposed < 0.6  # often wrong, sometimes right
    joint = target_joint()
    counts: dict[tuple[int, ...], int] = {}
    for p in paths:
        counts[p] = counts.get(p, 0) + 1
    # Cells expected at least 5 times are tested one by one; the rest are pooled.
    big = [path for path, p in joint.items() if p * SAMPLES >= 5]
    observed = [counts.get(path, 0) for path in big]
    expected = [joint[path] * SAMPLES for path in big]
    observed.append(SAMPLES - sum(observed))
    expected.append(SAMPLES - sum(expected))
    assert sum(1 for path in counts if joint[path] == 0.0) == 0  # nothing top-k removed
    assert chisquare(observed, expected).pvalue > 0.01
