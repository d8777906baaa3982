"""Tiny transformers checkpoints (saved with save_pretrained) and a driver that runs an
LLMRunner under the real scheduler."""

from __future__ import annotations

import random
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.llm.runner import LLMRunner
from omni.engines.step import step_message
from omni.shared import protocol
from scheduler.block_manager import BlockManager
from scheduler.request import Request, RequestId, SamplingParams
from scheduler.scheduler import Scheduler, SchedulerConfig

VOCAB = 256
# Small but varied: explicit head_dim != hidden / heads, llama3 RoPE and tied embeddings on
# llama; q/k/v biases on qwen2; every bias and non-trivial muP multipliers on granite; muP
# and Peri-LN on hyperclovax.
HF_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {
        "head_dim": 32,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    "qwen2": {"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}},
    "granite": {
        "attention_bias": True,
        "mlp_bias": True,
        "embedding_multiplier": 6.0,
        "attention_multiplier": 0.09,
        "residual_multiplier": 0.4,
        "logits_scaling": 3.0,
    },
    # granite's muP with logits multiplied rather than divided, and Peri-LN
    "hyperclovax": {
        "embedding_multiplier": 3.0,
        "attention_multiplier": 0.11,
        "residual_multiplier": 0.6,
        "logits_scaling": 0.7,
        "use_post_norm": True,
    },
}


@pytest.fixture(scope="package", autouse=True)
def _one_torch_thread() -> Any:
    # The models here are tiny: a second intra-op thread only adds synchronisation, and on a
    # busy 2-core machine its spin-waits made these tests 3-6x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _hf_config(model_type: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.for_model(
        model_type,
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **HF_CONFIGS[model_type],
    )


def _randomize(model: torch.nn.Module, seed: int) -> None:
    # HF zero-inits biases and one-inits norms; random values make a skipped term visible.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.1 * noise)


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """model_type -> (checkpoint dir, transformers model in float32 eval mode)."""
    from transformers import AutoModelForCausalLM

    made: dict[str, tuple[Path, Any]] = {}

    def get(model_type: str) -> tuple[Path, Any]:
        if model_type not in made:
            model = AutoModelForCausalLM.from_config(_hf_config(model_type), attn_implementation="eager")
            _randomize(model.float(), seed=len(model_type))
            model.eval()
            out = tmp_path_factory.mktemp(f"hf-{model_type}")
            model.save_pretrained(out)
            made[model_type] = (out, model)
        return made[model_type]

    return get


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return list(out[0, len(prompt) :].tolist())


class StepDriver:
    """Drives an LLMRunner exactly as the engine does: the real Scheduler and BlockManager,
    the engine's own step_message(), and every Step round-tripped through the wire format.
    Requests join at chosen steps; `chunk` is the step's token budget, so long prompts
    prefill in pieces; the free block queue is shuffled so block tables are not contiguous.
    speculate: requests may speculate (the runner needs a drafter to draft for them)."""

    def __init__(
        self, runner: LLMRunner, chunk: int | None = None, seed: int = 0, *, speculate: bool = False
    ) -> None:
        self.speculate = speculate
        self.runner = runner
        capacity = runner.num_kv_blocks * runner.block_size
        blocks = BlockManager(runner.num_kv_blocks, runner.block_size, enable_prefix_caching=True)
        order = list(blocks._free)
        random.Random(seed).shuffle(order)
        blocks._free = OrderedDict.fromkeys(order)  # a test's liberty: scatter the tables
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=64,
                max_num_batched_tokens=chunk or 4096,
                max_model_len=min(runner.max_model_len, capacity),
            ),
            blocks,
        )
        self.step_id = 0
        self.results: list[protocol.StepResult] = []

    def run(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        *,
        join_at: list[int] | None = None,
        sampling: list[protocol.SamplingOptions] | None = None,
    ) -> list[list[int]]:
        join_at = join_at or [0] * len(prompts)
        sampling = sampling or [protocol.SamplingOptions(temperature=0.0)] * len(prompts)
        requests = [
            Request(
                request_id=RequestId(f"r{i}"),
                prompt_token_ids=list(p),
                sampling_params=SamplingParams(
                    max_tokens=max_new_tokens,
                    temperature=s.temperature,
                    top_p=s.top_p,
                    top_k=s.top_k,
                    seed=s.seed,
                    logprobs=s.logprobs,
                    ignore_eos=True,
                    presence_penalty=s.presence_penalty,
                    frequency_penalty=s.frequency_penalty,
                    repetition_penalty=s.repetition_penalty,
                    logit_bias=tuple(zip(s.logit_bias_token_ids, s.logit_bias_values)),
                    min_p=s.min_p,
                    allowed_token_ids=None if s.allowed_token_ids is None else tuple(s.allowed_token_ids),
                    bad_words_token_ids=tuple(tuple(w) for w in s.bad_words_token_ids),
                    min_tokens=s.min_tokens,
                    stop_token_ids=tuple(s.min_tokens_stop_ids),  # never stop: the stops only matter as min_tokens bans
                ),
            )
            for i, (p, s) in enumerate(zip(prompts, sampling))
        ]
        for request in requests:
            request.speculate = self.speculate
        pending = list(zip(join_at, requests))
        while pending or self.scheduler.has_unfinished_requests:
            for at, request in [(at, r) for at, r in pending if at <= self.step_id]:
                self.scheduler.add_request(request)
                pending.remove((at, request))
            self._step()
        self._step()  # the last finished ids reach the worker, as they do with the next step
        assert not self.runner.requests
        self.scheduler.block_manager.check_invariants()
        return [r.output_token_ids for r in requests]

    def _step(self) -> None:
        output = self.scheduler.schedule()
        step = step_message(output, output.finished_request_ids)
        # the message crosses a process boundary in production: round-trip it here too
        decoded = protocol.decode(protocol.encode(step))
        assert isinstance(decoded, protocol.Step) and decoded == step
        result = self.runner.execute(decoded)
        self.results.append(result)
        tokens: dict[RequestId, list[int]] = {}
        for s in result.sampled:
            tokens.setdefault(RequestId(s.request_id), []).append(s.token_id)
        drafted = {RequestId(d.request_id): d.num_tokens for d in result.drafted}
        self.scheduler.update_from_output(output, tokens, drafted)
        self.step_id += 1
