"""The step items' bounds: hand-computed numbers for the arithmetic, and on the CPU the real
sampler, penalty counts and prompt-logprob slices held under them, their live tensors counted
by a dispatch mode (LiveBytes) as a device's allocator would count them. On CUDA (the smoke
run's `-m cuda`): the recorded largest graph and the sampler under their bounds, measured."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpu_workers.attention.backend import HeadShape
from gpu_workers.attention.compiled_decode import DecodeGraphBackend
from gpu_workers.attention.registry import create_attention_backend
from gpu_workers.llm import step_memory
from gpu_workers.llm.decode_graph import table_widths
from gpu_workers.llm.loader import load_model, read_model_config
from gpu_workers.llm.memory import CudaMemory
from gpu_workers.llm.step_memory import (
    StepShape,
    graph_bytes_per_row,
    graph_pool_bound,
    measure_graph_pool,
    measure_sampler,
    penalties_bound,
    penalty_slots,
    prompt_logprobs_bound,
    sampler_bound,
    step_items,
)
from gpu_workers.models.registry import CausalLM
from gpu_workers.sample.penalties import PenaltyCounts
from gpu_workers.sample.sampler import Sampler
from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from omni.shared import protocol

MIB = 1024**2
ON_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _model(tmp_path: Path, device: str = "cpu", dtype: torch.dtype = torch.float32, block_size: int = 4) -> CausalLM:
    """The tiny model as a worker with the compiled decode step loads it."""
    model_dir = make_tiny_checkpoint(tmp_path, "hyperclovax")
    c = read_model_config(model_dir)
    inner = create_attention_backend(
        "auto", block_size=block_size, device=torch.device(device), dtype=dtype,
        heads=HeadShape(c.num_heads, c.num_kv_heads, c.head_dim),
    )  # fmt: skip
    return load_model(model_dir, device=torch.device(device), dtype=dtype, backend=DecodeGraphBackend(inner))


class LiveBytes(TorchDispatchMode):
    """The most bytes of storages made under the mode that were alive at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and (storage := t.untyped_storage()).nbytes() and id(storage) not in self.live:
                self.live[id(storage)] = storage.nbytes()
                self.now += storage.nbytes()
                self.peak = max(self.peak, self.now)
                weakref.finalize(storage, self._gone, id(storage))
        return out

    def _gone(self, key: int) -> None:
        self.now -= self.live.pop(key)


@dataclass
class History:
    token_ids: list[int]
    num_prompt_tokens: int = 1


@dataclass(frozen=True)
class Llama8B:  # the shapes graph_bytes_per_row reads
    model_type: str = "llama"
    vocab_size: int = 128256
    hidden_size: int = 4096
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    attention_scale: float = 128**-0.5
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False


def test_the_prompt_logprobs_slice() -> None:
    # a 100-row chunk of a 1472 vocabulary fits one slice: 12 bytes a logit, 512 a row
    assert prompt_logprobs_bound(100, 1472) == 12 * 100 * 1472 + 512 * 100
    # a long chunk of a 151,936 vocabulary: slices of 2**26 // 151936 = 441 rows, about 770 MiB
    assert prompt_logprobs_bound(8192, 151936) == 12 * 441 * 151936 + 512 * 8192
    assert 760 * MIB < prompt_logprobs_bound(8192, 151936) < 775 * MIB


def test_penalty_slots_follow_the_counts_growth() -> None:
    """penalty_slots is the capacity PenaltyCounts reaches holding that many requests, however
    they arrive (one by one, or most at once and then one more), and the bound is its two
    tensors (bool, float32) and half as much again while it grows."""
    vocab = 50
    for requests, first in [(1, 1), (8, 1), (9, 1), (64, 1), (65, 1), (64, 63), (30, 29), (65, 64)]:
        counts = PenaltyCounts()
        for keys in [[str(i) for i in range(first)], *([str(i)] for i in range(first, requests))]:
            plan = counts.plan(keys, [History([1, 2])] * len(keys))
            counts.update({k: torch.from_numpy(a) for k, a in plan.items()}, vocab, torch.float32)
        assert counts.prompt_seen is not None and counts.output_counts is not None
        held = counts.prompt_seen.nbytes + counts.output_counts.nbytes
        assert counts.prompt_seen.shape[0] == penalty_slots(requests)
        assert held == penalty_slots(requests) * vocab * 5
        assert penalties_bound(requests, vocab) == held + held // 2
    assert [penalty_slots(n) for n in (1, 8, 9, 64, 65)] == [8, 8, 16, 64, 128]


SAMPLINGS = {
    "top-k and top-p, min_p, penalties, logprobs": protocol.SamplingOptions(
        temperature=1.0, top_k=50, top_p=0.9, min_p=0.01, logprobs=20,
        repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5,
    ),
    "top-p only": protocol.SamplingOptions(temperature=0.7, top_p=0.5),
    "allowed tokens, bad words, a bias, min_tokens": protocol.SamplingOptions(
        temperature=1.0, allowed_token_ids=list(range(900)), bad_words_token_ids=[[5], [6, 7]],
        logit_bias_token_ids=[1, 2], logit_bias_values=[3.0, -3.0], min_tokens=3, min_tokens_stop_ids=[0],
    ),
    "greedy with logprobs": protocol.SamplingOptions(temperature=0.0, logprobs=5),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_the_sampler_stays_under_its_bound(name: str) -> None:
    """The real sampler at 64 rows of a 1472 vocabulary, a request's counts kept: every tensor
    it makes, alive at once at its deepest, is under the bound with the penalties'."""
    rows, vocab = 64, 1472
    logits = torch.randn(rows, vocab)
    keys = [f"r{i}" for i in range(rows)]
    with LiveBytes() as live:
        Sampler().sample(logits, [SAMPLINGS[name]] * rows, [None] * rows, [History([1, 2])] * rows, request_ids=keys)
    assert 0 < live.peak <= sampler_bound(rows, vocab) + penalties_bound(rows, vocab)


def test_a_prompt_logprobs_chunk_stays_under_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's prompt logprobs of a 300-row chunk in slices of 64 rows (the slice shrunk
    to 64 * 1472 logits): what they hold at once is under the bound of that slice. (It holds
    more than two slices' worth: the previous slice's log_softmax lives on into the next.)"""
    from gpu_workers.llm import runner as runner_module
    from gpu_workers.llm.runner import LLMRunner, RequestState, _PromptRows

    runner = LLMRunner(make_tiny_checkpoint(tmp_path, "hyperclovax"), block_size=4, num_kv_blocks=4)
    vocab = runner.model_config.vocab_size
    monkeypatch.setattr(step_memory, "PROMPT_LOGITS_PER_SLICE", 64 * vocab)
    assert runner_module.prompt_slice_rows(300, vocab) == 64
    runner.requests["a"] = RequestState(list(range(301)), [], protocol.SamplingOptions(prompt_logprobs=20))
    hidden = torch.randn(300, runner.model_config.hidden_size)
    with torch.inference_mode(), LiveBytes() as live:
        out = runner._prompt_logprobs(hidden, _PromptRows("a", 0, 1, 300))
    assert len(out.token_logprobs) == 300
    assert 8 * 64 * vocab < live.peak <= prompt_logprobs_bound(300, vocab)


def test_a_graph_rows_bytes_by_hand() -> None:
    """A Llama-3-8B's row of the largest CUDA graph at 32768 tokens (a table of 2048 blocks of
    16) in bf16, with the gather kernel: the scores dominate."""
    inputs = (4 + 2048) * 8
    outputs = 4096 * 2 + 2 * (2 * 32 * 8 * 128 * 2)
    dense = 4 * (2 * 28672 + 8 * 4096 + 3 * (32 + 16) * 128)
    scores = 2048 * 16 * (8 + 1 + 8 * 32)
    per_row = graph_bytes_per_row(Llama8B(), 28672, 2, 2048, 16, gather=True)
    assert per_row == inputs + outputs + dense + scores
    assert graph_bytes_per_row(Llama8B(), 28672, 2, 2048, 16, gather=False) == per_row - scores
    assert 64 * per_row < 600 * MIB  # max_num_seqs 64: about 0.55 GiB


def test_the_graph_pool_is_the_largest_bucket_at_the_widest_table(tmp_path: Path) -> None:
    model = _model(tmp_path)
    shape = StepShape(48, 1000, 16, 0, graphs=True)
    assert table_widths(1000, 16) == [2, 4, 8, 16, 32, 64]  # 63 blocks hold 1000 tokens
    # the tiny model's widest linear is gate|up, 2 * 128
    assert graph_pool_bound(model, torch.float32, shape) == 48 * graph_bytes_per_row(model.config, 256, 4, 64, 16, True)
    library = StepShape(48, 1000, 16, 0, graphs=True, kernel="paged")
    assert graph_pool_bound(model, torch.float32, library) == 48 * graph_bytes_per_row(
        model.config, 256, 4, 64, 16, False
    )


class PeakReader:
    """A MemoryReader whose every measured call peaks `peak` bytes above what it started at."""

    def __init__(self, peak: int) -> None:
        self.peak_bytes = peak

    def free_and_total(self) -> tuple[int, int]:
        return 0, 0

    def allocated(self) -> int:
        return 0

    def reset_peak(self) -> None:
        pass

    def peak(self) -> int:
        return self.peak_bytes

    def release(self) -> None:
        pass

    def hold(self, nbytes: int) -> None:
        pass


def test_step_items_take_the_larger_of_bound_and_measurement(tmp_path: Path) -> None:
    model = _model(tmp_path)
    v = model.config.vocab_size
    shape = StepShape(8, 64, 4, 32, graphs=True)
    low = step_items(PeakReader(1), model, torch.float32, shape)
    assert (low.sampler, low.penalties) == (sampler_bound(8, v), penalties_bound(8, v))
    assert low.prompt_logprobs == prompt_logprobs_bound(32, v)
    # on the CPU the graph pool is not recorded: its bound stands
    assert low.graph_pool == graph_pool_bound(model, torch.float32, shape) and "measured" not in low.notes["graph pool"]
    high = step_items(PeakReader(10 * MIB), model, torch.float32, shape)
    assert high.sampler + high.penalties == 10 * MIB
    assert "measured 0.01 with the penalties" in high.notes["sampler"]


def test_the_largest_graph_records_on_the_cpu(tmp_path: Path) -> None:
    """measure_graph_pool's path on the CPU (the compiled layer step, no pool): it runs, and
    its scratch cache is all it writes."""
    model = _model(tmp_path)
    assert measure_graph_pool(PeakReader(123), model, torch.float32, StepShape(4, 40, 4, 0, graphs=True)) == 123


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=ON_CUDA)])
def test_on_cuda_the_measured_items_stay_under_their_bounds(tmp_path: Path, device: str) -> None:
    """The smoke run's check of the bounds: recording the largest graph (64 rows, 8192 tokens)
    and the sampler at 64 rows peak under their bounds, and the graphs' pool is given back (the
    second recording: the first also compiles and makes cuBLAS's workspaces, which stay)."""
    model = _model(tmp_path, device, torch.bfloat16, block_size=16)
    reader = CudaMemory(torch.device(device))
    shape = StepShape(64, 8192, 16, 8192, graphs=True)
    first = measure_graph_pool(reader, model, torch.bfloat16, shape)
    reader.release()
    before = torch.cuda.memory_reserved()
    recorded = measure_graph_pool(reader, model, torch.bfloat16, shape)
    reader.release()
    bound = graph_pool_bound(model, torch.bfloat16, shape)
    print(f"graph pool: bound {bound}, recorded {first} then {recorded} bytes")  # for the smoke run's log
    assert recorded is not None and 0 < recorded <= bound
    assert torch.cuda.memory_reserved() <= before
    v = model.config.vocab_size
    assert 0 < measure_sampler(reader, shape, v, torch.device(device)) <= sampler_bound(64, v) + penalties_bound(64, v)
