"""A real trained model from a GGUF file, served beside a random one (issue 23, point 4):
SmolLM2-135M-Instruct's Q4_1 file, its tokenizer, chat template and stop token from the file's
metadata. The server is the README's first command, a bare `omni-serve` (no --model): it serves
the omni default and SmolLM2 side by side. Asked through the official client with greedy
sampling, SmolLM2 answers as it does in transformers and llama.cpp: "The capital of France is Paris."
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.server import running_server


@pytest.fixture(scope="module")
def server(smollm2_gguf: Path) -> Iterator[str]:
    # smollm2_gguf: fetched (or the test skipped) before the server looks for it in the same cache.
    # No --model: the default list. Only the flags that keep it small: no image or audio
    # decoder processes, a short context and a small KV cache.
    with running_server(
        "--no-image-output", "--no-audio-output", "--max-model-len", "2048", "--kv-cache-memory", str(64 << 20),
        timeout=300.0,  # two models and the omni default's encoder load side by side
    ) as base:  # fmt: skip
        yield base


def test_smollm2_answers_the_capital_of_france(server: str) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    assert sorted(m.id for m in client.models.list()) == ["omni-tiny", "smollm2"]
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=32,
        temperature=0,
    )
    choice = reply.choices[0]
    assert "Paris" in (choice.message.content or ""), choice.message.content
    assert choice.finish_reason == "stop"  # the file's eos (<|im_end|>) ended it, not max_tokens
    assert reply.model == "smollm2"
    # the other model answers too, from the same server (routed by the body's `model`)
    other = client.chat.completions.create(
        model="omni-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert other.model == "omni-tiny" and other.usage is not None and other.usage.completion_tokens >= 1


def test_smollm2_in_int8_answers_the_capital_of_france(smollm2_gguf: Path) -> None:
    """--quantization int8: the file's Q4_1/Q8_0 blocks dequantized, then its linear layers (but
    q|k|v and the down projections, the model class's INT8_KEEP) requantized to int8 per output channel;
    the answer stays the same. It asks with a system message: the README's bare "What is the
    capital of France?" is a near-tie in bf16 itself (first token "The" 25.75
    against "L" 25.5, one bf16 step apart at that size), which int8's rounding flips into a
    French ramble; int8's agreement with bf16 over many prompts is bench/int8_quality.py's (97.6 %)."""
    with running_server(
        "--model", f"smollm2={smollm2_gguf}", "--quantization", "int8", "--dtype", "bfloat16",
        "--max-model-len", "2048", "--kv-cache-memory", str(32 << 20),
    ) as base:  # fmt: skip
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
        reply = client.chat.completions.create(
            model="smollm2",
            messages=[
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"},
            ],
            max_tokens=32,
            temperature=0,
        )
    content = reply.choices[0].message.content or ""
    assert "Paris" in content, content
    assert reply.choices[0].finish_reason == "stop"
