"""A GGUF checkpoint against transformers on a real trained model (issue 23, acceptance 2):
SmolLM2-135M-Instruct as llama.cpp's Q4_1 file (Q4_1 and Q8_0 blocks, q/k rows permuted for
llama.cpp's RoPE), loaded by us (gpu_workers/gguf_weights.py through loader.load_model and the
LLMRunner) and by transformers' AutoModelForCausalLM.from_pretrained(dir, gguf_file=...), which
dequantizes the same blocks with its own mapping and processors.

Measured on CPU, float32:
    weights     every tensor equal to transformers' (bf16 here: its float32 rounded once)
    greedy      20 chat prompts x 32 tokens equal token for token; the sampled tokens'
                logprobs within 2.4e-5 of transformers' teacher-forced ones
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from gpu_workers.loader import _our_name, load_model
from gpu_workers.models.llama import MergedLinear
from gpu_workers.runners.llm import LLMRunner
from omni.shared import protocol
from omni.text.tokenizer import TextTokenizer
from tests.gpu_workers.conftest import StepDriver, hf_greedy

CPU = torch.device("cpu")
MAX_NEW = 32
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Give me a synonym for happy.",
    "Who wrote Romeo and Juliet?",
    "Explain photosynthesis in one sentence.",
    "What is the boiling point of water in Celsius?",
    "Translate 'good morning' into Spanish.",
    "List two benefits of exercise.",
    "What planet is known as the Red Planet?",
    "Describe a cat in five words.",
    "What does a CPU do?",
    "Suggest a name for a pet goldfish.",
    "Why is the sky blue?",
    "What is the largest ocean on Earth?",
    "Tell me a fun fact about honey.",
    "How do you make a cup of tea?",
    "What is the square root of 81?",
]


@pytest.fixture(scope="module")
def hf(smollm2_gguf: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    return model.eval()


def test_weights_equal_transformers_dequantized_ones_cast_to_the_serving_dtype(smollm2_gguf: Path, hf: Any) -> None:
    ours = load_model(smollm2_gguf, device=CPU, dtype=torch.bfloat16, backend=TorchSDPABackend(16, CPU))
    assert ours.config.num_layers == 30 and ours.config.tie_word_embeddings
    params = dict(ours.named_parameters())
    modules = dict(ours.named_modules())
    theirs = hf.state_dict()
    assert len(theirs) == 1 + 30 * 9 + 2  # embeddings, 9 per layer, final norm, the tied head
    for hf_name, want in theirs.items():
        if hf_name == "lm_head.weight":
            continue  # tied: embed_tokens
        target = _our_name(hf_name)
        assert target is not None, hf_name
        name, shard = target
        got = params[name].data
        if shard is not None:
            module = modules[name.rsplit(".", 1)[0]]
            assert isinstance(module, MergedLinear)
            start = sum(module.shard_sizes[:shard])
            got = got[start : start + module.shard_sizes[shard]]
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, want.to(torch.bfloat16)), hf_name


def test_greedy_equals_transformers_on_20_chat_prompts(smollm2_gguf: Path, hf: Any) -> None:
    """Ours as the worker runs it (LLMRunner on the file, packed CPU linears, the real
    scheduler, paged KV blocks scattered, prefill chunked), transformers generate() one prompt
    at a time. Sampled logprobs within 1e-3 (worst measured 2.4e-5)."""
    tokenizer = TextTokenizer.from_gguf(smollm2_gguf)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    runner = LLMRunner(smollm2_gguf, device="cpu", dtype=torch.float32, block_size=16, num_kv_blocks=20 * 8)
    driver = StepDriver(runner, chunk=256, seed=5)
    got = driver.run(prompts, MAX_NEW, sampling=[protocol.SamplingOptions(temperature=0.0, logprobs=0)] * len(prompts))
    logprobs: dict[str, list[float]] = {}
    for result in driver.results:
        for s in result.sampled:
            assert s.logprob is not None
            logprobs.setdefault(s.request_id, []).append(s.logprob)

    worst = 0.0
    for i, prompt in enumerate(prompts):
        want = hf_greedy(hf, prompt, MAX_NEW)
        assert got[i] == want, f"prompt {i} ({QUESTIONS[i]!r}): {tokenizer.decode(got[i])!r} != {tokenizer.decode(want)!r}"
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + want])).logits[0, len(prompt) - 1 : -1]
        theirs = logits.log_softmax(-1).gather(1, torch.tensor(want).view(-1, 1)).view(-1)
        worst = max(worst, (torch.tensor(logprobs[f"r{i}"]) - theirs).abs().max().item())
    assert "Paris" in tokenizer.decode(got[0])
    assert worst < 1e-3, worst
