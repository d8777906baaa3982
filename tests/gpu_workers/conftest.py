"""Tiny transformers checkpoints (saved with save_pretrained) and a miniature scheduler."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from omni import protocol
from gpu_workers.llm_runner import LLMRunner

VOCAB = 256
# Small but varied: explicit head_dim != hidden / heads, llama3 RoPE and tied embeddings on
# llama; q/k/v biases on qwen2; every bias and non-trivial muP multipliers on granite.
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


@dataclass
class _Req:
    request_id: str
    token_ids: list[int]
    sampling: protocol.SamplingOptions
    max_new_tokens: int
    num_computed: int = 0
    block_ids: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    sent: bool = False


class MiniScheduler:
    """Drives an LLMRunner with protocol Steps the way the real scheduler does: requests
    join at chosen steps, prefill in chunks of at most `chunk` tokens, decode one token a
    step, and get blocks from a shuffled free list so block tables are not contiguous."""

    def __init__(self, runner: LLMRunner, chunk: int | None = None, seed: int = 0) -> None:
        self.runner = runner
        self.chunk = chunk
        self.free = list(range(runner.num_kv_blocks))
        random.Random(seed).shuffle(self.free)
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
        pending = [
            (at, _Req(f"r{i}", list(p), s, max_new_tokens))
            for i, (p, at, s) in enumerate(zip(prompts, join_at, sampling))
        ]
        running: list[_Req] = []
        done: list[_Req] = []
        finished_ids: list[str] = []
        while pending or running:
            running += [r for at, r in pending if at <= self.step_id]
            pending = [(at, r) for at, r in pending if at > self.step_id]
            new, cached, scheduled = [], [], {}
            bs = self.runner.block_size
            for r in running:
                n = len(r.token_ids) - r.num_computed
                if self.chunk is not None:
                    n = min(n, self.chunk)
                need = -(-(r.num_computed + n) // bs) - len(r.block_ids)
                fresh = [self.free.pop() for _ in range(max(need, 0))]
                r.block_ids += fresh
                scheduled[r.request_id] = n
                if not r.sent:
                    new.append(
                        protocol.NewRequest(r.request_id, list(r.token_ids), r.sampling, list(r.block_ids), r.num_computed, n)
                    )
                    r.sent = True
                else:
                    cached.append(protocol.CachedRequest(r.request_id, fresh, r.num_computed, n))
            step = protocol.Step(self.step_id, new, cached, finished_ids)
            # the message crosses a process boundary in production: round-trip it here too
            decoded = protocol.decode(protocol.encode(step))
            assert isinstance(decoded, protocol.Step) and decoded == step
            result = self.runner.execute(decoded)
            self.results.append(result)
            self.step_id += 1
            finished_ids = []
            by_id = {s.request_id: s for s in result.sampled}
            for r in list(running):
                r.num_computed += scheduled[r.request_id]
                if r.request_id in by_id:
                    assert r.num_computed == len(r.token_ids)
                    tok = by_id[r.request_id].token_id
                    r.token_ids.append(tok)
                    r.output.append(tok)
                else:
                    assert r.num_computed < len(r.token_ids)
                if len(r.output) == r.max_new_tokens:
                    running.remove(r)
                    done.append(r)
                    finished_ids.append(r.request_id)
                    self.free += r.block_ids
        self.runner.execute(protocol.Step(self.step_id, [], [], finished_ids))
        assert not self.runner.requests
        return [r.output for r in sorted(done, key=lambda r: int(r.request_id[1:]))]
