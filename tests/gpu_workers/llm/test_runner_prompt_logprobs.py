"""Prompt logprobs from the runner against transformers' log-softmax over the same prompt,
across chunked prefills, a preemption, and prefill-only requests."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpu_workers.llm.runner import LLMRunner
from omni.shared import protocol
from scheduler.request import Request, RequestId, SamplingParams
from tests.gpu_workers.conftest import StepDriver

PROMPT = [5, 17, 99, 3, 250, 41, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 200, 13, 77, 64, 9, 9, 9]
K = 3


def reference(hf: Any, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' prompt logprobs: per token 1.., its logprob, rank, and the top-K logprobs."""
    with torch.no_grad():
        logprobs = hf(torch.tensor([prompt])).logits[0, :-1].float().log_softmax(dim=-1)  # (P-1, V)
    target = logprobs.gather(1, torch.tensor(prompt[1:])[:, None])
    ranks = (logprobs >= target).sum(dim=-1)
    return target.squeeze(1), ranks, logprobs.topk(K, dim=-1).values


def runner(model_dir: Any, num_kv_blocks: int = 64) -> LLMRunner:
    return LLMRunner(model_dir, device="cpu", dtype=torch.float32, block_size=4, num_kv_blocks=num_kv_blocks)


def run(driver: StepDriver, prompts: list[list[int]], max_tokens: int, prompt_logprobs: list[int | None]) -> None:
    for i, (prompt, k) in enumerate(zip(prompts, prompt_logprobs)):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, prompt_logprobs=k, ignore_eos=True)
        driver.scheduler.add_request(Request(RequestId(f"r{i}"), list(prompt), params))
    while driver.scheduler.has_unfinished_requests:
        driver._step()
    driver._step()  # the finished ids reach the worker
    assert not driver.runner.requests
    driver.scheduler.block_manager.check_invariants()


def collected(results: list[protocol.StepResult], request_id: str) -> list[protocol.PromptLogprobs]:
    return [p for r in results for p in r.prompt_logprobs if p.request_id == request_id]


def flatten(parts: list[protocol.PromptLogprobs]) -> tuple[list[float], list[int], list[list[float]], list[list[int]]]:
    position = 1
    chosen, ranks, tops, top_ids = [], [], [], []
    for p in parts:
        assert p.start == position  # in order, none missing, none twice
        position += len(p.token_logprobs)
        chosen += p.token_logprobs
        ranks += p.ranks
        tops += p.top_logprobs
        top_ids += p.top_token_ids
    return chosen, ranks, tops, top_ids


@pytest.mark.parametrize("model_type", ["llama", "granite", "hyperclovax"])
def test_chunked_prompt_logprobs_match_transformers(hf_checkpoint: Any, model_type: str) -> None:
    model_dir, hf = hf_checkpoint(model_type)
    want_chosen, want_ranks, want_top = reference(hf, PROMPT)
    driver = StepDriver(runner(model_dir), chunk=5)
    # beside a plain request, so the packed batch mixes rows that want prompt logprobs
    run(driver, [PROMPT, PROMPT[:9]], 3, [K, None])
    parts = collected(driver.results, "r0")
    assert len(parts) == -(-len(PROMPT) // 5) > 1  # one per chunk: the prefill was split
    chosen, ranks, tops, top_ids = flatten(parts)
    assert len(chosen) == len(PROMPT) - 1
    assert torch.allclose(torch.tensor(chosen), want_chosen, atol=1e-4, rtol=0)
    assert ranks == want_ranks.tolist()
    assert torch.allclose(torch.tensor(tops), want_top, atol=1e-4, rtol=0)
    assert all(len(ids) == K for ids in top_ids)
    # a rank-1 token is its position's top token
    assert all(ids[0] == t for ids, t, r in zip(top_ids, PROMPT[1:], ranks) if r == 1)
    assert not collected(driver.results, "r1")


def test_prompt_logprobs_of_zero_have_no_alternatives(hf_checkpoint: Any) -> None:
    model_dir, hf = hf_checkpoint("qwen2")
    want_chosen, want_ranks, _ = reference(hf, PROMPT)
    driver = StepDriver(runner(model_dir), chunk=64)
    run(driver, [PROMPT], 1, [0])
    chosen, ranks, tops, top_ids = flatten(collected(driver.results, "r0"))
    assert torch.allclose(torch.tensor(chosen), want_chosen, atol=1e-4, rtol=0)
    assert ranks == want_ranks.tolist() and tops == top_ids == [[]] * (len(PROMPT) - 1)


def test_a_prefill_only_request_samples_nothing(hf_checkpoint: Any) -> None:
    model_dir, hf = hf_checkpoint("llama")
    want_chosen, _, _ = reference(hf, PROMPT)
    driver = StepDriver(runner(model_dir), chunk=8)
    run(driver, [PROMPT], 0, [1])
    assert not any(r.sampled for r in driver.results)
    chosen, _, _, _ = flatten(collected(driver.results, "r0"))
    assert torch.allclose(torch.tensor(chosen), want_chosen, atol=1e-4, rtol=0)


def test_a_recomputed_prompt_sends_no_logprob_twice(hf_checkpoint: Any) -> None:
    model_dir, hf = hf_checkpoint("llama")
    want_chosen, _, _ = reference(hf, PROMPT[:10])
    r = runner(model_dir)
    options = protocol.SamplingOptions(temperature=0.0, prompt_logprobs=0)
    first = r.execute(protocol.Step(0, [protocol.NewRequest("a", PROMPT[:10], options, [0, 1], 0, 6)], [], []))
    # preempted after its first chunk: the whole prompt again, into other blocks
    again = r.execute(protocol.Step(1, [], [protocol.CachedRequest("a", [5, 6, 7], 0, 10, resumed=True)], []))
    (p0,), (p1,) = first.prompt_logprobs, again.prompt_logprobs
    assert (p0.start, len(p0.token_logprobs), p1.start, len(p1.token_logprobs)) == (1, 6, 7, 3)
    got = torch.tensor(p0.token_logprobs + p1.token_logprobs)
    assert torch.allclose(got, want_chosen, atol=1e-4, rtol=0)
    assert [s.request_id for s in again.sampled] == ["a"]


def test_negative_prompt_logprobs_are_refused(hf_checkpoint: Any) -> None:
    r = runner(hf_checkpoint("llama")[0])
    options = protocol.SamplingOptions(prompt_logprobs=-1)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        r.execute(protocol.Step(0, [protocol.NewRequest("a", [1, 2], options, [0], 0, 2)], [], []))
