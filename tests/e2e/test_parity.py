"""Greedy output through the HTTP API equals transformers' greedy generate, token for token.

Each model type gets a small random checkpoint saved in the Hugging Face layout; requests go
in concurrently, half streamed, with a step budget small enough that prompts are prefilled
in chunks and blocks small enough that every request crosses block boundaries.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from omni.text.tokenizer import TextTokenizer
from tests.e2e.conftest import read_metric
from tests.e2e.server import running_server

MAX_TOKENS = 20
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "user", "content": "Summarise the plot of a long novel about the sea."}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "What colour is the sky on a clear day in summer?"},
    ],
    [{"role": "user", "content": "def fib(n):\n    return n if n < 2 else"}],
    [{"role": "user", "content": "Ünïcödé, 東京, and emoji 🎉 in one line."}],
    [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "One, two, three."},
        {"role": "user", "content": "Now backwards, slowly, with a comment on each number."},
    ],
]


def reference_greedy(model_dir: Path, prompts: list[list[int]], eos: frozenset[int]) -> list[list[int]]:
    """transformers' greedy tokens per prompt, cut before the first near-tie of the top two."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    results = []
    for ids in prompts:
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            eos_token_id=sorted(eos),
            pad_token_id=sorted(eos)[0],
            output_scores=True,
            return_dict_in_generate=True,
        )
        tokens = out.sequences[0, len(ids) :].tolist()
        for step, scores in enumerate(out.scores):
            top2 = scores[0].float().topk(2).values
            if float(top2[0] - top2[1]) < 1e-4:  # a tie: either token is a right answer
                tokens = tokens[:step]
                break
        else:
            if tokens and tokens[-1] in eos:
                tokens = tokens[: tokens.index(tokens[-1]) + 1]
        results.append(tokens)
    return results


async def _chat(client: httpx.AsyncClient, base: str, messages: list, stream: bool) -> tuple[str, int]:
    body = {
        "model": "m",
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    if not stream:
        body.pop("stream_options")
        r = await client.post(f"{base}/v1/chat/completions", json=body)
        r.raise_for_status()
        out = r.json()
        return out["choices"][0]["message"]["content"], out["usage"]["completion_tokens"]
    text, usage = [], 0
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"]:
                text.append(chunk["choices"][0]["delta"].get("content", ""))
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
    return "".join(text), usage


async def _run_all(base: str, conversations: list, concurrent: bool) -> list[tuple[str, int]]:
    async with httpx.AsyncClient(timeout=120) as client:
        if concurrent:
            return list(
                await asyncio.gather(
                    *(_chat(client, base, m, i % 2 == 1) for i, m in enumerate(conversations))
                )
            )
        return [await _chat(client, base, m, False) for m in conversations]


def _assert_matches(tok: TextTokenizer, got: list[tuple[str, int]], expected: list[list[int]]) -> None:
    for (text, n_tokens), ref in zip(got, expected):
        if len(ref) == MAX_TOKENS or (ref and ref[-1] in tok.eos_token_ids):
            assert n_tokens == len(ref)
            assert text == tok.decode(ref)
        else:  # cut at a tie: the agreed part must be a prefix
            assert text.startswith(tok.decode(ref))


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "hyperclovax"])
def test_greedy_matches_transformers(tmp_path: Path, model_type: str) -> None:
    model_dir = make_tiny_checkpoint(tmp_path / model_type, model_type, seed=5)
    tok = TextTokenizer.from_dir(model_dir)
    prompts = [tok.apply_chat_template(m) for m in CONVERSATIONS]
    expected = reference_greedy(model_dir, prompts, tok.eos_token_ids)
    assert sum(len(e) for e in expected) > MAX_TOKENS * len(CONVERSATIONS) // 2
    # qwen2 runs the compiled decode step (--compile-decode), the others eager: both paths meet
    # transformers over HTTP, each reading the paged cache in place with the CPU kernel
    with running_server(
        "--model", f"m={model_dir}", "--block-size", "4", "--num-kv-blocks", "256",
        "--max-num-batched-tokens", "24", "--max-model-len", "256", compiled=model_type == "qwen2",
    ) as base:  # fmt: skip
        got = asyncio.run(_run_all(base, CONVERSATIONS, concurrent=True))
    _assert_matches(tok, got, expected)


def test_batched_equals_alone_under_preemption_and_chunking(tmp_path: Path) -> None:
    """The same greedy outputs alone, and all at once with too few KV blocks for all."""
    model_dir = make_tiny_checkpoint(tmp_path / "hcx", "hyperclovax", seed=9, use_post_norm=True)
    conversations = CONVERSATIONS * 2
    # 40 blocks of 4 tokens hold 160 tokens: three or four of these requests at a time.
    with running_server(
        "--model", f"m={model_dir}", "--block-size", "4", "--num-kv-blocks", "40",
        "--max-num-batched-tokens", "16", "--max-model-len", "160",
    ) as base:  # fmt: skip
        alone = asyncio.run(_run_all(base, conversations, concurrent=False))
        assert read_metric(base, "vllm:num_preemptions_total") == 0
        together = asyncio.run(_run_all(base, conversations, concurrent=True))
        assert read_metric(base, "vllm:num_preemptions_total") > 0
    assert together == alone
