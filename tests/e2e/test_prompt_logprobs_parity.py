"""Prompt logprobs through the HTTP API equal transformers' log-softmax over the same prompt, to
1e-4: a prompt prefilled in chunks (a step budget of 8 tokens), after another request has put
its blocks in the prefix cache, and echo with max_tokens 0 (a loglikelihood harness's call)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from omni.text.tokenizer import TextTokenizer
from tests.e2e.server import running_server

PROMPT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
TOP = 3
TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=["granite", "hyperclovax"])
def model_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    # muP multipliers and logits scaling, which granite divides by and hyperclovax (the
    # reference model, with Peri-LN too) multiplies by; transformers has a class for each
    model_type = request.param
    return make_tiny_checkpoint(tmp_path_factory.mktemp("plp") / model_type, model_type, seed=3)


@pytest.fixture(scope="module")
def base(model_dir: Path) -> Iterator[str]:
    with running_server(
        "--model", f"m={model_dir}", "--block-size", "4", "--num-kv-blocks", "128",
        "--max-num-batched-tokens", "8", "--max-model-len", "256",
    ) as url:  # fmt: skip
        yield url


@pytest.fixture(scope="module")
def prompt_ids(model_dir: Path) -> list[int]:
    ids = TextTokenizer.from_dir(model_dir).encode(PROMPT)
    assert len(ids) > 16  # at least three chunks of 8
    return ids


@pytest.fixture(scope="module")
def reference(model_dir: Path, prompt_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' logprob and rank of each prompt token 1.., and the top-TOP ids and values."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs = model(torch.tensor([prompt_ids])).logits[0, :-1].float().log_softmax(dim=-1)
    target = logprobs.gather(1, torch.tensor(prompt_ids[1:])[:, None])
    top = logprobs.topk(TOP, dim=-1)
    return target.squeeze(1), (logprobs >= target).sum(dim=-1), top.indices, top.values


def complete(base: str, **fields: Any) -> dict[str, Any]:
    r = httpx.post(f"{base}/v1/completions", json={"model": "m", "temperature": 0, **fields}, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_prompt_logprobs_of_a_chunked_prompt_match_transformers(
    base: str, prompt_ids: list[int], reference: tuple[torch.Tensor, ...]
) -> None:
    want, want_rank, top_ids, top_values = reference
    complete(base, prompt=prompt_ids, max_tokens=2)  # the prompt's blocks are cached now
    body = complete(base, prompt=prompt_ids, max_tokens=2, prompt_logprobs=TOP)
    plp = body["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(prompt_ids)
    got = [plp[q][str(t)]["logprob"] for q, t in enumerate(prompt_ids) if q > 0]
    worst = (torch.tensor(got) - want).abs().max().item()
    assert worst < TOLERANCE, worst
    assert [plp[q][str(t)]["rank"] for q, t in enumerate(prompt_ids) if q > 0] == want_rank.tolist()
    for q in range(1, len(prompt_ids)):
        alternatives = [(int(k), v["logprob"]) for k, v in plp[q].items() if v["rank"] <= TOP]
        alternatives.sort(key=lambda a: -a[1])
        assert [k for k, _ in alternatives] == top_ids[q - 1].tolist()
        assert torch.allclose(torch.tensor([v for _, v in alternatives]), top_values[q - 1], atol=TOLERANCE, rtol=0)
    # every prompt token was computed again, none served from the cache
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    print(f"prompt logprobs vs transformers: {len(got)} positions, max |diff| {worst:.2e}")


def test_echo_with_max_tokens_zero_scores_the_prompt_as_transformers_does(
    base: str, prompt_ids: list[int], reference: tuple[torch.Tensor, ...]
) -> None:
    want = reference[0]
    body = complete(base, prompt=PROMPT, echo=True, max_tokens=0, logprobs=1)
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (PROMPT, "length")
    assert body["usage"]["completion_tokens"] == 0
    lp = choice["logprobs"]
    assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == len(prompt_ids)
    worst = (torch.tensor(lp["token_logprobs"][1:]) - want).abs().max().item()
    assert worst < TOLERANCE, worst
    # the loglikelihood of the prompt's tail, as an evaluation harness sums it
    assert sum(lp["token_logprobs"][1:]) == pytest.approx(want.sum().item(), abs=len(want) * TOLERANCE)
