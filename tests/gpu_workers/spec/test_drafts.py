"""Speculative decoding in the runner, driven by the real scheduler: greedy output with drafts
verified equals plain decoding, whatever the drafts, and the step emits several tokens when
drafts hold."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from gpu_workers.llm.runner import LLMRunner
from gpu_workers.spec.drafts import (
    BACKOFF_ABOVE,
    MAX_BACKOFF,
    Drafter,
    NgramDrafter,
    SuffixDrafter,
    accepted,
    draft_next,
    fits,
    ngram_draft,
)
from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from omni.shared import protocol
from tests.gpu_workers.conftest import StepDriver

GREEDY = protocol.SamplingOptions(temperature=0.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "llama")


class OracleDrafter:
    """Drafts the plain run's own continuation, every `wrong`-th draft token replaced: each
    step then sees accepted drafts, a rejection, or all accepted."""

    def __init__(self, expected: dict[tuple[int, ...], list[int]], k: int, wrong: int) -> None:
        self.expected, self.k, self.wrong = expected, k, wrong
        self.calls = 0
        self.released: list[str] = []

    def draft(self, request_id: str, tokens: Sequence[int], num_prompt_tokens: int, limit: int) -> list[int]:
        self.calls += 1
        for prompt, output in self.expected.items():
            if tuple(tokens[: len(prompt)]) == prompt:
                done = len(tokens) - len(prompt)
                out = output[done : done + min(self.k, limit)]
                return [(t + 1) % 64 if (done + i) % self.wrong == self.wrong - 1 else t for i, t in enumerate(out)]
        return []

    def release(self, request_id: str) -> None:
        self.released.append(request_id)


def runner(model: Path, drafter: object = None) -> LLMRunner:
    return LLMRunner(model, block_size=4, num_kv_blocks=128, drafter=drafter)  # type: ignore[arg-type]


def emitted_per_step(driver: StepDriver) -> list[int]:
    """The most tokens one request got in one step, per step."""
    most = []
    for result in driver.results:
        counts: dict[str, int] = {}
        for s in result.sampled:
            counts[s.request_id] = counts.get(s.request_id, 0) + 1
        most.append(max(counts.values(), default=0))
    return most


PROMPTS = [
    [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6],
    [20, 21, 22, 23, 24, 25, 26, 27],
    [30, 31, 30, 31, 30, 31, 30, 31, 30, 31, 30],
]


@pytest.mark.parametrize("wrong", [2, 3, 100])
def test_verified_drafts_give_the_plain_output(tiny: Path, wrong: int) -> None:
    plain = StepDriver(runner(tiny)).run(PROMPTS, 20)
    oracle = OracleDrafter({tuple(p): o for p, o in zip(PROMPTS, plain)}, k=4, wrong=wrong)
    driver = StepDriver(runner(tiny, oracle), speculate=True)
    assert driver.run(PROMPTS, 20) == plain
    assert oracle.calls > 0
    assert sorted(oracle.released) == ["r0", "r1", "r2"]  # each request, once it left
    most = emitted_per_step(driver)
    assert max(most) > 1  # some step emitted accepted drafts and the token after them
    if wrong == 100:  # every draft right: 1 + k tokens a step once decoding
        assert max(most) == 5
        assert len(driver.results) < 20


def test_ngram_drafts_give_the_plain_output(tiny: Path) -> None:
    plain = StepDriver(runner(tiny)).run(PROMPTS, 24)
    driver = StepDriver(runner(tiny, NgramDrafter(3, 1, 3)), speculate=True)
    assert driver.run(PROMPTS, 24) == plain
    assert any(r.drafted for r in driver.results)


OPTIONS = [
    protocol.SamplingOptions(temperature=0.8, seed=7),
    protocol.SamplingOptions(temperature=1.1, seed=8, top_k=20, top_p=0.9, min_p=0.02, presence_penalty=0.7, frequency_penalty=0.4),
    protocol.SamplingOptions(temperature=0.0, repetition_penalty=1.3),
    protocol.SamplingOptions(temperature=0.9, seed=9, repetition_penalty=1.2, bad_words_token_ids=[[7, 8], [31, 30]], logprobs=2),
    protocol.SamplingOptions(temperature=0.0, min_tokens=6, min_tokens_stop_ids=[9, 30], allowed_token_ids=list(range(40))),
    protocol.SamplingOptions(temperature=0.0, logit_bias_token_ids=[6, 31], logit_bias_values=[3.0, -2.0], logprobs=1),
]


@pytest.mark.parametrize("wrong", [2, 3])
def test_every_sampling_field_applies_to_each_verified_row(tiny: Path, wrong: int) -> None:
    """A batch mixing seeded sampled requests (temperature, top-k/top-p/min-p, every penalty,
    bad_words) and greedy ones (repetition penalty, min_tokens, allowed ids, logit_bias), with
    drafts that are often wrong: each request's tokens and logprobs are the plain run's. Seeds
    key each draw by position, so a sampled request's text is the same with rejected rows."""
    prompts = [[40 + i, *p] for i, p in enumerate(PROMPTS * 2)][: len(OPTIONS)]
    plain_driver = StepDriver(runner(tiny))
    plain = plain_driver.run(prompts, 16, sampling=OPTIONS)
    oracle = OracleDrafter({tuple(p): o for p, o in zip(prompts, plain)}, k=3, wrong=wrong)
    driver = StepDriver(runner(tiny, oracle), speculate=True)
    assert driver.run(prompts, 16, sampling=OPTIONS) == plain

    def logprobs(d: StepDriver, request_id: str) -> list[float | None]:
        return [s.logprob for r in d.results for s in r.sampled if s.request_id == request_id]

    for request_id in ("r3", "r5"):
        assert logprobs(driver, request_id) == pytest.approx(logprobs(plain_driver, request_id), abs=1e-5)
    assert {d.request_id for r in driver.results for d in r.drafted} == {f"r{i}" for i in range(len(OPTIONS))}
    assert max(emitted_per_step(driver)) > 1


def test_suffix_drafts_give_the_plain_output(tiny: Path) -> None:
    spec = protocol.LLMWorkerSpec(
        model_dir=str(tiny), speculative_method="suffix", num_speculative_tokens=3, suffix_decoding_max_tree_depth=8
    )
    drafter = Drafter.from_spec(spec)
    assert isinstance(drafter, SuffixDrafter) and drafter.num_tokens == 3 and drafter.cache.depth == 8
    plain = StepDriver(runner(tiny)).run(PROMPTS, 24)
    driver = StepDriver(runner(tiny, drafter), speculate=True)
    assert driver.run(PROMPTS, 24) == plain
    assert any(r.drafted for r in driver.results)
    # every request left: its tree went, its output joined the global tree
    assert not drafter.cache.requests
    assert sorted(drafter.cache.global_tree.sequences.values()) == sorted(plain)
    # the same prompts again: the global tree drafts from the first run's outputs too
    again = StepDriver(runner(tiny, drafter), speculate=True)
    assert again.run(PROMPTS, 24) == plain
    assert len(again.results) <= len(driver.results)


def test_from_spec() -> None:
    assert Drafter.from_spec(protocol.LLMWorkerSpec(model_dir="m")) is None
    ngram = protocol.LLMWorkerSpec(model_dir="m", speculative_method="ngram", num_speculative_tokens=4, prompt_lookup_max=3)
    assert Drafter.from_spec(ngram) == NgramDrafter(4, 1, 3)
    suffix = Drafter.from_spec(
        protocol.LLMWorkerSpec(
            model_dir="m",
            speculative_method="suffix",
            num_speculative_tokens=5,
            suffix_decoding_max_tree_depth=16,
            suffix_decoding_max_cached_requests=7,
            suffix_decoding_max_spec_factor=2.0,
            suffix_decoding_min_token_prob=0.25,
        )
    )
    assert isinstance(suffix, SuffixDrafter) and suffix.num_tokens == 5
    c = suffix.cache
    assert (c.depth, c.max_cached_requests, c.max_spec_factor, c.min_token_prob) == (16, 7, 2.0, 0.25)
    # the drafter caps the suffix drafts at num_tokens and the limit
    tokens = list(range(10, 30)) + list(range(10, 22))
    assert suffix.draft("a", tokens, 0, 9) == list(range(22, 27))
    assert suffix.draft("a", tokens, 0, 2) == [22, 23]
    assert NgramDrafter(4, 1, 3).draft("a", tokens, 0, 9) == list(range(22, 26))


def test_speculative_steps_take_the_native_decode(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A verifying step's rows are decode rows to the attention backend (row i sees its own
    context), so the model's one-call native decode serves it where it serves plain decodes."""
    from gpu_workers.models import llama_small_m

    r = runner(tiny, NgramDrafter(3, 1, 3))
    if r.native_rows == 0:
        pytest.skip("the small-M extension is not built here")
    served: list[tuple[int, bool]] = []
    plain = llama_small_m.model_forward

    def counted(model: object, h: torch.Tensor, *rest: object) -> torch.Tensor | None:
        out = plain(model, h, *rest)  # type: ignore[arg-type]
        served.append((h.shape[0], out is not None))
        return out

    monkeypatch.setattr(llama_small_m, "model_forward", counted)
    expected = StepDriver(runner(tiny)).run(PROMPTS[:1], 20)
    assert StepDriver(r, speculate=True).run(PROMPTS[:1], 20) == expected
    multi = [ok for rows, ok in served if rows > 1 and rows <= r.native_rows]
    assert multi and all(multi)


@pytest.mark.parametrize(
    ("tokens", "k", "n_min", "n_max", "draft"),
    [
        ([1, 2, 3, 4, 5, 6, 7, 1, 2, 3], 4, 1, 3, [4, 5, 6, 7]),
        ([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 4, 2, 3, [9, 2, 3, 8]),  # the 3-gram wins over the later 2-gram
        ([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 4, 2, 2, [8, 1, 2, 3]),  # only 2-grams: the latest
        ([4, 2, 3, 9, 2, 3, 8, 1, 2, 3], 2, 3, 3, []),  # no earlier 3-gram
        ([5, 5, 5, 5, 5, 5, 5], 3, 1, 2, [5, 5, 5]),  # the latest occurrence that k tokens follow
        ([5, 5, 5, 5], 3, 1, 2, [5, 5]),  # none does: the one most tokens follow
        ([1, 2], 3, 1, 2, []),
        ([7], 3, 1, 1, []),
        ([1, 2, 3, 1, 2, 3], 0, 1, 2, []),
    ],
)
def test_ngram_draft(tokens: list[int], k: int, n_min: int, n_max: int, draft: list[int]) -> None:
    assert ngram_draft(tokens, k, n_min, n_max) == draft


def test_who_may_speculate() -> None:
    for yes in (
        protocol.SamplingOptions(temperature=0.0, speculate=True, logprobs=3, bad_words_token_ids=[[1]]),
        protocol.SamplingOptions(temperature=0.7, speculate=True, seed=3, top_p=0.5),
        protocol.SamplingOptions(temperature=0.0, speculate=True, repetition_penalty=1.1, presence_penalty=0.5),
    ):
        assert fits(yes)
    assert not fits(protocol.SamplingOptions(temperature=0.0))  # the server said no (a grammar, or off)
    assert not fits(protocol.SamplingOptions(temperature=0.0, speculate=True, prefill_only=True))


def test_accepted_counts_the_agreeing_prefix() -> None:
    assert accepted([4, 5, 6], [4, 5, 6, 7]) == 3
    assert accepted([4, 5, 6], [4, 9, 6, 7]) == 1
    assert accepted([4, 5, 6], [0, 5, 6, 7]) == 0
    assert accepted([], [3]) == 0


@dataclass
class _State:
    token_ids: list[int]
    num_prompt_tokens: int = 1
    draft: list[int] = field(default_factory=list)
    sampling: protocol.SamplingOptions = field(default_factory=lambda: protocol.SamplingOptions(speculate=True))
    backoff: tuple[int, int, int] = (0, 0, 0)


class _Sevens(Drafter):
    """Drafts 7s, as many as allowed (at most 8)."""

    def draft(self, request_id: str, tokens: Sequence[int], num_prompt_tokens: int, limit: int) -> list[int]:
        return [7] * min(8, limit)


def _drive(num_requests: int, truth: Callable[[int], int], steps: int = 60) -> list[int]:
    """One request decoding `truth` (its token at each position) among num_requests, every
    draft verified: the length of the draft each step makes (0: none)."""
    states = {f"r{i}": _State([1]) for i in range(num_requests)}
    state, lengths = states["r0"], []
    for _ in range(steps):
        start = len(state.token_ids)
        held = accepted(state.draft, [truth(start + j) for j in range(len(state.draft))])
        state.token_ids += [truth(start + j) for j in range(held + 1)]
        sampled = [protocol.SampledToken("r0", t, None, None) for t in state.token_ids[start:]]
        draft_next(_Sevens(), states, sampled, 10_000)
        lengths.append(len(state.draft))
    return lengths


def test_drafts_that_keep_missing_back_off_only_in_a_busy_worker() -> None:
    """A first draft token that misses counts; with more than BACKOFF_ABOVE requests in the
    worker, a request drafts again 2, 4, 8, 16, 16 ... tokens after its 1st, 2nd, 3rd, 4th, 5th
    miss in a row, and a hit clears it. In a quiet worker every step drafts in full."""
    quiet = _drive(BACKOFF_ABOVE, lambda i: 5)
    assert quiet == [8] * 60
    busy = _drive(BACKOFF_ABOVE + 1, lambda i: 5)
    drafted = [i for i, n in enumerate(busy) if n]
    # a draft at step s misses at s + 1, which waits 2^m tokens: the next draft is 2^m + 1 on
    assert [b - a for a, b in zip(drafted, drafted[1:])] == [3, 5, 9, 17, MAX_BACKOFF + 1]
    assert [busy[i] for i in drafted] == [8, 1, 1, 1, 1, 1]  # a miss leaves one token to try
    hit = _drive(BACKOFF_ABOVE + 1, lambda i: 7 if i == 10 else 5)  # the draft at step 8 holds
    assert [i for i, n in enumerate(hit) if n][:5] == [0, 3, 8, 9, 12]


def test_a_busy_worker_drafts_as_far_as_drafts_held() -> None:
    """Drafts that hold for two tokens, then miss: a busy worker's next draft is two long;
    one that holds in full grows by one token a step, back to the drafter's length."""
    two_then_miss = lambda i: 5 if i % 3 == 0 else 7  # noqa: E731
    assert _drive(BACKOFF_ABOVE, two_then_miss, 12) == [8] * 12
    busy = _drive(BACKOFF_ABOVE + 1, two_then_miss, 12)
    # 8 held one (a token differed): 1, which held in full: 2, which missed (the pattern moved
    # under it): a miss's back-off, 1 ...
    assert busy == [8, 1, 2, 0, 0, 1, 0, 0, 0, 0, 1, 2]
    assert _drive(BACKOFF_ABOVE + 1, lambda i: 7, 12) == [8] * 12
    # after a miss, one token, then one more each step its draft holds in full
    grows = _drive(BACKOFF_ABOVE + 1, lambda i: 5 if i == 2 else 7, 14)
    assert grows == [8, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8]  # the miss backs off 2 tokens
