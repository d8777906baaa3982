"""Our Llama-family model and runner against transformers on the same tiny weights (hyperclovax
against transformers 5's native HyperCLOVAXForCausalLM)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpu_workers.attention.backend import SequenceChunk
from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from gpu_workers.llm.loader import load_model
from gpu_workers.llm.runner import LLMRunner
from gpu_workers.models.llama import ARCHITECTURES
from tests.gpu_workers.conftest import StepDriver, hf_greedy

MODEL_TYPES = list(ARCHITECTURES)  # every registered variant, checked against transformers
PROMPTS = [
    [5, 17, 99, 3, 250, 41, 7],
    [200, 13],
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
    [77],
]
MAX_NEW = 9


def our_logits(model_dir: Any, prompt: list[int]) -> torch.Tensor:
    backend = TorchSDPABackend(block_size=4, device=torch.device("cpu"))
    model = load_model(model_dir, device=torch.device("cpu"), dtype=torch.float32, backend=backend)
    c = model.config
    num_blocks = -(-len(prompt) // 4)
    kv_caches = [
        (torch.zeros(num_blocks, 4, c.num_kv_heads, c.head_dim), torch.zeros(num_blocks, 4, c.num_kv_heads, c.head_dim))
        for _ in range(c.num_layers)
    ]
    meta = backend.build_metadata([SequenceChunk(0, len(prompt), 0, list(range(num_blocks)))])
    with torch.inference_mode():
        hidden = model(torch.tensor(prompt), torch.arange(len(prompt)), kv_caches, meta)
        return model.compute_logits(hidden)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_logits_match_transformers(hf_checkpoint: Any, model_type: str) -> None:
    model_dir, hf = hf_checkpoint(model_type)
    prompt = PROMPTS[0] + PROMPTS[2]
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    got = our_logits(model_dir, prompt)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < 1e-4


def runner(model_dir: Any, block_size: int = 4) -> LLMRunner:
    return LLMRunner(model_dir, device="cpu", dtype=torch.float32, block_size=block_size, num_kv_blocks=64)


@pytest.fixture(scope="module")
def expected_tokens(hf_checkpoint: Any) -> dict[str, list[list[int]]]:
    return {t: [hf_greedy(hf_checkpoint(t)[1], p, MAX_NEW) for p in PROMPTS] for t in MODEL_TYPES}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_batched_greedy_matches_generate(
    hf_checkpoint: Any, expected_tokens: dict[str, list[list[int]]], model_type: str
) -> None:
    got = StepDriver(runner(hf_checkpoint(model_type)[0])).run(PROMPTS, MAX_NEW)
    assert got == expected_tokens[model_type]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_chunked_prefill_matches_generate(
    hf_checkpoint: Any, expected_tokens: dict[str, list[list[int]]], model_type: str
) -> None:
    sched = StepDriver(runner(hf_checkpoint(model_type)[0]), chunk=3)
    assert sched.run(PROMPTS, MAX_NEW) == expected_tokens[model_type]
    # the 13-token prompt really was split: its first steps sampled nothing
    assert "r2" not in {s.request_id for s in sched.results[0].sampled}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_mixed_prefill_and_decode_steps_match_generate(
    hf_checkpoint: Any, expected_tokens: dict[str, list[list[int]]], model_type: str
) -> None:
    # r0 decodes while r1 prefills at step 2 and r2 prefills in chunks of 5 from step 3
    sched = StepDriver(runner(hf_checkpoint(model_type)[0], block_size=2), chunk=5, seed=1)
    got = sched.run(PROMPTS, MAX_NEW, join_at=[0, 2, 3, 3])
    assert got == expected_tokens[model_type]


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "granite"])
def test_compiled_decode_greedy_matches_generate(
    hf_checkpoint: Any, expected_tokens: dict[str, list[list[int]]], model_type: str
) -> None:
    """Token for token in fp32 with every decode step through the compiled step (one compile
    per model type, of one tiny layer); prefill and mixed steps stay eager."""
    r = LLMRunner(hf_checkpoint(model_type)[0], dtype=torch.float32, block_size=4, num_kv_blocks=64,
                  compile_decode=True, max_num_seqs=8)  # fmt: skip
    assert r.decode_graph is not None
    r.native_rows = 0  # the compiled step takes the small decode steps too (else the native decode does)
    calls = 0
    forward = r.decode_graph.forward

    def counted(*args: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return forward(*args)

    r.decode_graph.forward = counted  # type: ignore[method-assign]
    assert StepDriver(r).run(PROMPTS, MAX_NEW) == expected_tokens[model_type]
    assert calls >= MAX_NEW - 1  # the decode steps took the compiled path


def test_sharded_checkpoint_loads(hf_checkpoint: Any, tmp_path: Any) -> None:
    _, hf = hf_checkpoint("qwen2")
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    prompt = PROMPTS[0]
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    assert (our_logits(tmp_path, prompt) - expected).abs().max().item() < 1e-4


@pytest.mark.parametrize("backend", ["flex_paged", "torch_sdpa"])
def test_prefix_cache_hits_match_generate(hf_checkpoint: Any, backend: str) -> None:
    """Later requests reuse the first one's cached prefix blocks (their first chunk continues at
    position 8 or 12), through both CPU attention backends, token for token as transformers."""
    model_dir, hf = hf_checkpoint("qwen2")
    prefix = [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 22, 33]
    prompts = [prefix + [40], prefix[:8] + [50, 60], prefix + [70, 80, 90, 100, 110]]
    expected = [hf_greedy(hf, p, MAX_NEW) for p in prompts]
    r = LLMRunner(model_dir, device="cpu", dtype=torch.float32, block_size=4, num_kv_blocks=64,
                  attention_backend=backend)  # fmt: skip
    starts: list[int] = []  # where each request's first chunk began
    execute = r.execute

    def recording(step: Any) -> Any:
        starts.extend(n.num_computed_tokens for n in step.new_requests)
        return execute(step)

    r.execute = recording  # type: ignore[method-assign]
    assert StepDriver(r).run(prompts, MAX_NEW, join_at=[0, 2, 3]) == expected
    assert starts == [0, 8, 12]
