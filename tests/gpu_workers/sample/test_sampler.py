from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pytest
import torch
from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

from gpu_workers.sample.sampler import (
    Sampler,
    position_generators,
    position_seed,
    process_logits,
    validate_options,
    warp_logits,
)
from omni.shared.protocol import SamplingOptions

INF = float("inf")


def logits(n: int = 4, v: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, v, generator=torch.Generator().manual_seed(seed)) * 3


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@dataclass
class History:
    """A request's tokens as the runner's RequestState holds them."""

    prompt: list[int]
    output: list[int]

    @property
    def token_ids(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt)


def no_history(n: int) -> list[History]:
    return [History([1], []) for _ in range(n)]


def banned(x: torch.Tensor) -> list[list[int]]:
    """Per row, the token ids that can no longer be sampled."""
    return [torch.nonzero(row == -INF).flatten().tolist() for row in x]


def test_greedy_is_argmax() -> None:
    x = logits()
    out = Sampler().sample(x, [SamplingOptions(temperature=0.0)] * 4, [None] * 4, no_history(4))
    assert [o.token_id for o in out] == x.argmax(-1).tolist()
    assert all(o.logprob is None and o.top_logprobs is None for o in out)


def test_top_k_1_equals_greedy() -> None:
    x = logits(v=1000)
    out = Sampler().sample(x, [SamplingOptions(temperature=1.5, top_k=1)] * 4, [None] * 4, no_history(4))
    assert [o.token_id for o in out] == x.argmax(-1).tolist()


def test_tiny_top_p_equals_greedy() -> None:
    x = logits(v=1000)
    out = Sampler().sample(x, [SamplingOptions(temperature=1.0, top_p=1e-6)] * 4, [gen(1)] * 4, no_history(4))
    assert [o.token_id for o in out] == x.argmax(-1).tolist()


def test_top_k_keeps_sampling_inside_the_top_k() -> None:
    x = logits(n=1, v=100)
    allowed = set(x[0].topk(3).indices.tolist())
    g = gen(3)
    for _ in range(30):
        (o,) = Sampler().sample(x, [SamplingOptions(temperature=5.0, top_k=3)], [g], no_history(1))
        assert o.token_id in allowed


def test_seeded_sampling_is_reproducible_and_independent_of_batch() -> None:
    x = logits(n=3, v=1000)
    opts = [SamplingOptions(temperature=1.0, seed=7), SamplingOptions(temperature=1.0), SamplingOptions(temperature=0.0)]

    def run(rows: list[int]) -> list[int]:
        g = gen(7)
        return [Sampler().sample(x[rows], [opts[i] for i in rows], [g if i == 0 else None for i in rows], no_history(len(rows)))[0].token_id
                for _ in range(20)]  # fmt: skip

    alone, batched = run([0]), run([0, 1, 2])
    assert alone == batched
    assert len(set(alone)) > 1  # it really samples


def test_logprobs_come_from_raw_logits() -> None:
    x = logits(n=2, v=30)
    raw = x.log_softmax(-1)
    opts = [SamplingOptions(temperature=0.5, logprobs=3), SamplingOptions(temperature=0.0, logprobs=0)]
    out = Sampler().sample(x, opts, [gen(0), None], no_history(2))
    assert out[0].logprob == pytest.approx(raw[0, out[0].token_id].item(), abs=1e-6)
    assert out[1].logprob == pytest.approx(raw[1].max().item(), abs=1e-6) and out[1].top_logprobs is None
    top = raw[0].topk(3)
    assert out[0].top_logprobs is not None
    assert [t for t, _ in out[0].top_logprobs] == top.indices.tolist()
    assert [lp for _, lp in out[0].top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-6)


# ---- logit processors: penalties and min_p against transformers' own processors


def test_no_adjusting_request_leaves_the_logits_untouched() -> None:
    x = logits(n=3)
    assert process_logits(x, [SamplingOptions(temperature=0.7, top_k=3, min_p=0.2)] * 3, no_history(3)) is x


def test_repetition_penalty_matches_transformers() -> None:
    x = logits(n=3, v=50)
    x[0, 12] = 0.0  # a logit of exactly 0 in the history: transformers divides it
    # row 0's prompt and output both count; row 2 repeats tokens (a set, for transformers)
    histories = [History([3, 12, 40], [7, 7, 3]), History([9, 1], [2]), History([5, 5, 5], [5, 6])]
    penalties = [1.3, 0.6, 2.0]
    opts = [SamplingOptions(temperature=0.0, repetition_penalty=p) for p in penalties]
    got = process_logits(x, opts, histories)
    for i, (h, p) in enumerate(zip(histories, penalties)):
        expected = RepetitionPenaltyLogitsProcessor(p)(torch.tensor([h.token_ids]), x[i : i + 1].clone())
        assert torch.equal(got[i], expected[0])
    assert got[0, 12].item() == 0.0
    assert torch.equal(got[:, 41:], x[:, 41:])  # no history past token 40: nothing changed


def test_frequency_and_presence_penalties_follow_openai_over_output_tokens() -> None:
    x = logits(n=2, v=30)
    histories = [History([4, 4, 9], [4, 11, 11, 11, 2]), History([0, 1, 2], [])]
    opts = [
        SamplingOptions(temperature=0.0, frequency_penalty=0.5, presence_penalty=-1.25),
        SamplingOptions(temperature=1.0, frequency_penalty=2.0, presence_penalty=2.0),
    ]
    got = process_logits(x, opts, histories)
    # OpenAI: logit - count * frequency_penalty - (count > 0) * presence_penalty, by hand
    counts = {4: 1, 11: 3, 2: 1}  # row 0's output; its prompt's 4, 4 and 9 do not count
    expected = [
        x[0, t].item() - counts.get(t, 0) * 0.5 - (counts.get(t, 0) > 0) * -1.25 for t in range(30)
    ]
    assert got[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert got[0, 9].item() == x[0, 9].item()  # in the prompt only: untouched
    assert torch.equal(got[1], x[1])  # no output yet: nothing to penalize


def test_repetition_then_frequency_and_presence_in_vllm_order() -> None:
    x = logits(n=1, v=20)
    h = History([1, 2], [2, 3, 3])
    opts = [SamplingOptions(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.25, presence_penalty=0.5)]
    got = process_logits(x, opts, [h])
    step1 = RepetitionPenaltyLogitsProcessor(1.5)(torch.tensor([h.token_ids]), x.clone())[0]
    counts = {2: 1, 3: 2}
    expected = [step1[t].item() - counts.get(t, 0) * 0.25 - (t in counts) * 0.5 for t in range(20)]
    assert got[0].tolist() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("temperature", "min_p"), [(1.0, 0.1), (0.5, 0.05), (1.7, 0.3), (1.0, 1.0)])
def test_min_p_after_temperature_matches_transformers(temperature: float, min_p: float) -> None:
    x = logits(n=3, v=200, seed=4)
    got = warp_logits(x, [SamplingOptions(temperature=temperature, min_p=min_p)] * 3)
    no_ids = cast(torch.LongTensor, torch.zeros(3, 0, dtype=torch.long))  # warpers ignore them
    expected = MinPLogitsWarper(min_p)(no_ids, TemperatureLogitsWarper(temperature)(no_ids, x.clone()))
    assert torch.equal(got, expected)
    kept = (got > -INF).sum(dim=1).tolist()
    assert all(1 <= k < 200 for k in kept)  # it really drops tokens, and keeps the top one


def test_sampling_with_min_p_stays_inside_the_kept_tokens() -> None:
    x = logits(n=1, v=100, seed=2)
    opts = [SamplingOptions(temperature=3.0, min_p=0.2)]
    probs = (x / 3.0).softmax(-1)[0]
    kept = set(torch.nonzero(probs >= 0.2 * probs.max()).flatten().tolist())
    g = gen(5)
    drawn = {Sampler().sample(x, opts, [g], no_history(1))[0].token_id for _ in range(2000)}
    assert drawn == kept
    assert len(kept) == 13  # of 100: the draw really is restricted, and reaches every kept token


# ---- logit_bias, allowed_token_ids, bad_words, min_tokens: by construction


def test_logit_bias_adds_to_the_raw_logits() -> None:
    x = logits(n=2, v=50)
    top = int(x[1].argmax())
    opts = [
        SamplingOptions(temperature=1.0, logit_bias_token_ids=[7, 8], logit_bias_values=[100.0, -3.5]),
        SamplingOptions(temperature=0.0, logit_bias_token_ids=[top], logit_bias_values=[-100.0]),
    ]
    got = process_logits(x, opts, no_history(2))
    assert got[0, 7].item() == pytest.approx(x[0, 7].item() + 100.0)
    assert got[0, 8].item() == pytest.approx(x[0, 8].item() - 3.5)
    assert got[1, top].item() == pytest.approx(x[1, top].item() - 100.0)
    changed = (got != x).nonzero().tolist()
    assert changed == [[0, 7], [0, 8], [1, top]]
    g = gen(0)
    outs = [Sampler().sample(x, opts, [g, None], no_history(2)) for _ in range(50)]
    assert {o[0].token_id for o in outs} == {7}  # +100 with temperature 1: always token 7
    second = int(x[1].topk(2).indices[1])
    assert {o[1].token_id for o in outs} == {second}  # greedy is argmax of the biased logits
    # logprobs still come from the raw logits
    biased = SamplingOptions(temperature=0.0, logprobs=0, logit_bias_token_ids=[7], logit_bias_values=[100.0])
    (with_lp,) = Sampler().sample(x[:1], [biased], [None], no_history(1))
    assert with_lp.token_id == 7
    assert with_lp.logprob == pytest.approx(x[0].log_softmax(-1)[7].item(), abs=1e-6)


def test_allowed_token_ids_are_the_only_ones_sampled() -> None:
    x = logits(n=2, v=50)
    opts = [SamplingOptions(temperature=5.0, allowed_token_ids=[3, 11, 40]), SamplingOptions(temperature=5.0)]
    got = process_logits(x, opts, no_history(2))
    assert banned(got) == [[t for t in range(50) if t not in (3, 11, 40)], []]
    assert got[0, [3, 11, 40]].tolist() == x[0, [3, 11, 40]].tolist()
    g = gen(1)
    drawn = {Sampler().sample(x, opts, [g, None], no_history(2))[0].token_id for _ in range(200)}
    assert drawn == {3, 11, 40}
    (greedy,) = Sampler().sample(x[:1], [SamplingOptions(temperature=0.0, allowed_token_ids=[3, 11, 40])], [None], no_history(1))
    assert greedy.token_id == max((3, 11, 40), key=lambda t: x[0, t].item())


def test_bad_words_ban_the_last_token_where_the_rest_ends_the_output() -> None:
    x = logits(n=4, v=20)
    words = [[5], [8, 9], [1, 2, 3]]
    opts = [SamplingOptions(temperature=1.0, bad_words_token_ids=words)] * 4
    histories = [
        History([8], []),  # the prompt ends in 8, but only the output counts: only 5
        History([0], [4, 8]),  # 8 ends the output: 9 too
        History([0], [1, 2]),  # 1, 2 ends it: 3 too
        History([0], [2, 1]),  # 1 alone is no prefix of [1, 2, 3]'s last token: only 5
    ]
    assert banned(process_logits(x, opts, histories)) == [[5], [5, 9], [3, 5], [5]]


def test_min_tokens_bans_stop_ids_until_enough_tokens_are_out() -> None:
    x = logits(n=3, v=20)
    x[:, 0] = 50.0  # EOS would win every time
    opts = [SamplingOptions(temperature=0.0, min_tokens=3, min_tokens_stop_ids=[0, 4])] * 3
    histories = [History([1, 2], []), History([1, 2], [6, 7]), History([1, 2], [6, 7, 8])]
    got = process_logits(x, opts, histories)
    assert banned(got) == [[0, 4], [0, 4], []]
    out = Sampler().sample(x, opts, [None] * 3, histories)
    assert [o.token_id for o in out] == [int(x[0, 1:].argmax()) + 1, int(x[1, 1:].argmax()) + 1, 0]


def test_validate_options_refuses_malformed_processors() -> None:
    bad = [
        SamplingOptions(repetition_penalty=0.0),
        SamplingOptions(logit_bias_token_ids=[1], logit_bias_values=[]),
        SamplingOptions(logit_bias_token_ids=[1], logit_bias_values=[INF]),
        SamplingOptions(min_p=1.5),
        SamplingOptions(allowed_token_ids=[]),
        SamplingOptions(bad_words_token_ids=[[]]),
        SamplingOptions(min_tokens=-1),
        SamplingOptions(allowed_token_ids=[-1]),
    ]
    for options in bad:
        with pytest.raises(ValueError):
            validate_options(options)
    validate_options(SamplingOptions(repetition_penalty=1.2, min_p=0.1, allowed_token_ids=[0], min_tokens=2))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_the_processors_empty_falls_back_to_its_masked_logits(temperature: float) -> None:
    """allowed_token_ids that exclude every token a grammar allows (the grammar mask is already
    in the logits): the grammar wins and the step goes on, greedy or sampled."""
    x = logits(2, 50, seed=3)
    x[0, :] = -INF
    x[0, [7, 9]] = 0.0  # the grammar allows only 7 and 9
    options = [
        SamplingOptions(temperature=temperature, allowed_token_ids=[3]),
        SamplingOptions(temperature=temperature, allowed_token_ids=[3]),
    ]
    out = Sampler().sample(x, options, [gen(0), gen(1)], no_history(2))
    assert out[0].token_id in (7, 9) and out[1].token_id == 3


def test_an_overflowing_penalty_falls_back_too() -> None:
    x = logits(1, 50, seed=4)
    options = [SamplingOptions(temperature=1.0, repetition_penalty=1e-320)]
    out = Sampler().sample(x, options, [gen(0)], [History([1, 2, 3], [])])
    assert 0 <= out[0].token_id < 50


@pytest.mark.parametrize(
    "options",
    [SamplingOptions(temperature=1.0, top_p=5e-324), SamplingOptions(temperature=5e-324), SamplingOptions(temperature=1e-6, top_p=1e-30)],
)
def test_values_at_the_edge_of_float32_sample_the_top_token(options: SamplingOptions) -> None:
    """A top_p or temperature that rounds to 0 in float32 (found by the fuzzer) is greedy."""
    x = logits(1, 50, seed=5)
    out = Sampler().sample(x, [options], [gen(0)], no_history(1))
    assert out[0].token_id == int(x[0].argmax())


@pytest.mark.parametrize(
    "options",
    [
        SamplingOptions(min_tokens=2, min_tokens_stop_ids=[3, 10]),
        SamplingOptions(allowed_token_ids=[10]),
        SamplingOptions(logit_bias_token_ids=[11], logit_bias_values=[1.0]),
        SamplingOptions(bad_words_token_ids=[[2, 10]]),
    ],
)
def test_token_ids_past_the_vocabulary_are_refused_before_they_index_the_logits(options: SamplingOptions) -> None:
    validate_options(options)  # no vocabulary given: only the sign is checked
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 10\)"):
        validate_options(options, vocab_size=10)


# ---- one staged copy, no per-row syncs: the same tokens as the per-row reference (review C4)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def reference_draws(
    probs: torch.Tensor, generators: list[torch.Generator | None]
) -> torch.Tensor:
    """The sampler before the change: one multinomial over the unseeded rows (global RNG),
    then one per seeded row from its own generator."""
    out = torch.empty(probs.shape[0], dtype=torch.int64, device=probs.device)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if unseeded:
        rows = torch.tensor(unseeded, device=probs.device)
        out[rows] = torch.multinomial(probs[rows], 1).squeeze(1)
    for i, g in enumerate(generators):
        if g is not None:
            out[i] = torch.multinomial(probs[i], 1, generator=g)[0]
    return out


def mixed_options() -> list[SamplingOptions]:
    return [
        SamplingOptions(temperature=0.8, seed=11, top_k=40),
        SamplingOptions(temperature=1.0),
        SamplingOptions(temperature=0.0),
        SamplingOptions(temperature=1.3, seed=12, top_p=0.9, min_p=0.02),
        SamplingOptions(temperature=0.7, top_p=0.95),
        SamplingOptions(temperature=1.0, seed=13),
    ]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[CUDA, pytest.mark.cuda])])
def test_seeded_and_unseeded_draws_equal_per_row_multinomial(device: str) -> None:
    """200 steps of a batch mixing seeded, unseeded and greedy rows: every token equals what
    per-row torch.multinomial drew from the same generators and global seed (exact)."""
    opts = mixed_options()
    n, v = len(opts), 3000

    def gens() -> list[torch.Generator | None]:
        return [torch.Generator(device=device).manual_seed(o.seed) if o.seed is not None else None for o in opts]

    new_g, ref_g = gens(), gens()
    sampler = Sampler()
    sampled = [i for i, o in enumerate(opts) if o.temperature > 0]
    for step in range(200):
        x = logits(n, v, seed=step).to(device)
        torch.manual_seed(1000 + step)
        if device == "cuda":
            torch.cuda.manual_seed(1000 + step)
        got = [o.token_id for o in sampler.sample(x.clone(), opts, new_g, no_history(n))]
        torch.manual_seed(1000 + step)
        if device == "cuda":
            torch.cuda.manual_seed(1000 + step)
        probs = warp_logits(x[sampled], [opts[i] for i in sampled]).softmax(-1)
        want = x.argmax(-1)
        want[sampled] = reference_draws(probs, [ref_g[i] for i in sampled])
        assert got == want.tolist(), step


def test_a_sampling_call_makes_one_copy_and_never_calls_multinomial(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_multinomial(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("multinomial syncs twice per call")

    monkeypatch.setattr(torch, "multinomial", no_multinomial)
    opts = [*mixed_options(), SamplingOptions(temperature=0.9, seed=3, presence_penalty=0.5, logit_bias_token_ids=[4],
                                              logit_bias_values=[2.0], bad_words_token_ids=[[7]], logprobs=2)]  # fmt: skip
    sampler = Sampler()
    gens = [gen(o.seed) if o.seed is not None else None for o in opts]
    mask = np.zeros(-(-50 // 32), dtype="<i4")
    mask[0] = 0b1011_0000
    sampler.sample(logits(len(opts), 50), opts, gens, no_history(len(opts)), masks=[None, mask.tobytes()] + [None] * 5,
                   request_ids=[str(i) for i in range(len(opts))])  # fmt: skip
    assert sampler._staging is not None and sampler._staging.num_copies == 1


def test_kept_penalty_counts_equal_a_recount_after_many_steps() -> None:
    """60 steps of penalised requests that come and go (slots freed and reused, the tensors
    grown): every step's processed logits equal a from-scratch recount of the histories (exact)."""
    v = 64
    rng = torch.Generator().manual_seed(5)
    sampler = Sampler()
    live: dict[str, History] = {}
    opts: dict[str, SamplingOptions] = {}
    kinds = [
        SamplingOptions(temperature=0.0, repetition_penalty=1.3),
        SamplingOptions(temperature=0.0, frequency_penalty=0.4, presence_penalty=0.2),
        SamplingOptions(temperature=0.0, repetition_penalty=0.8, frequency_penalty=-0.3),
        SamplingOptions(temperature=0.0),  # no penalty beside the others
    ]
    for step in range(60):
        if step % 7 == 0 or not live:  # a few arrive
            for k in range(3):
                rid = f"r{step}-{k}"
                live[rid] = History(torch.randint(0, v, (5 + k,), generator=rng).tolist(), [])
                opts[rid] = kinds[(step + k) % len(kinds)]
        if step % 5 == 4:  # one leaves
            gone = min(live)
            del live[gone]
            sampler.release(gone)
        ids = sorted(live)
        x = logits(len(ids), v, seed=step)
        hist = [live[r] for r in ids]
        want = process_logits(x, [opts[r] for r in ids], hist)
        out = sampler.sample(x.clone(), [opts[r] for r in ids], [None] * len(ids), hist, request_ids=ids)
        assert [o.token_id for o in out] == want.argmax(-1).tolist(), step
        rows = [i for i, r in enumerate(ids) if opts[r] is not kinds[3]]
        if rows:
            seen, counts = sampler.penalties.rows(
                torch.tensor([sampler.penalties.slots[ids[i]] for i in rows])
            )
            recount = torch.zeros(len(rows), v)
            for j, i in enumerate(rows):
                for t in hist[i].output:
                    recount[j, t] += 1
            assert torch.equal(counts, recount)
            assert seen.nonzero().tolist() == sorted([j, t] for j, i in enumerate(rows) for t in set(hist[i].token_ids))
        for r, o in zip(ids, out):
            live[r].output.append(o.token_id)


def test_pending_drafts_count_as_output_for_that_row_only() -> None:
    """Rows verifying drafts: a row after drafts d[:j] is processed as if d[:j] ended its
    history (penalties, bad_words, min_tokens), and the request's kept counts never hold them:
    the next call, with the tokens really accepted, equals a recount."""
    v = 40
    opts = SamplingOptions(temperature=0.0, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3,
                           bad_words_token_ids=[[3, 4], [7]], min_tokens=4, min_tokens_stop_ids=[5])  # fmt: skip
    history = History([1, 2, 9], [3])
    draft = [4, 3, 11]
    x = logits(4, v, seed=8)
    sampler = Sampler()
    out = sampler.sample(x.clone(), [opts] * 4, [None] * 4, [history] * 4, request_ids=["r"] * 4,
                         pending=[draft[:j] for j in range(4)])  # fmt: skip
    as_history = [History(history.prompt, history.output + draft[:j]) for j in range(4)]
    want = process_logits(x, [opts] * 4, as_history)
    assert [o.token_id for o in out] == want.argmax(-1).tolist()
    assert banned(want)[0] == [4, 5, 7] and banned(want)[1] == [5, 7]  # [3, 4] after 3; min_tokens
    history.output += [4, 6]  # one draft accepted, then another token
    y = logits(1, v, seed=9)
    (after,) = sampler.sample(y.clone(), [opts], [None], [history], request_ids=["r"])
    assert after.token_id == process_logits(y, [opts], [history]).argmax(-1).item()


def test_position_generators_key_each_draw_by_seed_and_position() -> None:
    pool: list[torch.Generator] = []
    device = torch.device("cpu")
    assert position_generators(None, 5, 3, pool, device) == [None] * 3 and not pool

    def draws(seed: int, index: int, rows: int) -> list[float]:
        return [g.initial_seed() if g else 0 for g in position_generators(seed, index, rows, pool, device)]

    one = draws(7, 10, 3)
    assert len(pool) == 3 and len(set(one)) == 3
    assert draws(7, 11, 2) == one[1:]  # the token at 11 draws the same whichever row it is
    assert draws(8, 10, 3) != one
    x = logits(1, 50)
    opts = [SamplingOptions(temperature=1.0, seed=7)]
    a = Sampler().sample(x, opts, position_generators(7, 10, 1, [], device), no_history(1))
    b = Sampler().sample(x, opts, [torch.Generator().manual_seed(position_seed(7, 10))], no_history(1))
    assert a[0].token_id == b[0].token_id
