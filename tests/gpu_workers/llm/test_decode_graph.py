"""The compiled decode step against the eager runner on one tiny random model: the same logits
(fp32, worst difference under 1e-4; measured ~3e-6 on the 100M bench model) for batches padded
to their bucket, the same cache contents in every real block (padding rows write only the
scratch block). It compiles once here (a few seconds on a
tiny model; inductor's disk cache keeps it across runs)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from gpu_workers.distributed import GroupMember
from gpu_workers.llm.decode_graph import DecodeGraph, decode_buckets, table_widths
from gpu_workers.llm.runner import LLMRunner
from omni.shared import protocol

GREEDY = protocol.SamplingOptions(temperature=0.0)
NUM_BLOCKS = 48


def test_buckets() -> None:
    assert decode_buckets(1) == [1]
    assert decode_buckets(8) == [1, 2, 4, 8]
    assert decode_buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    with pytest.raises(ValueError, match="max_num_seqs"):
        decode_buckets(0)


def test_table_widths_are_the_widths_cuda_steps_round_to() -> None:
    """table_widths (what the memory budget counts graphs for) holds every width a CUDA step's
    table is rounded to, up to max_model_len's, and no other."""
    cuda = DecodeGraph.__new__(DecodeGraph)
    cuda.cuda = True
    assert table_widths(1000, 16) == [2, 4, 8, 16, 32, 64]
    assert table_widths(16, 16) == [2] and table_widths(8192, 16) == [2, 4, 8, 16, 32, 64, 128, 256, 512]
    for max_model_len in (1, 33, 1000, 8192):
        blocks = -(-max_model_len // 16)
        assert sorted({cuda._width(b) for b in range(1, blocks + 1)}) == table_widths(max_model_len, 16)


def _runner(model_dir: Any, compiled: bool, kernel: str | None = None, quantization: str | None = None) -> LLMRunner:
    r = LLMRunner(
        model_dir, block_size=4, num_kv_blocks=NUM_BLOCKS, compile_decode=compiled, decode_kernel=kernel,
        quantization=quantization,
    )  # fmt: skip
    if compiled:
        # the CUDA layout on CPU: buckets of 1, 2, 4, 8, each batch padded to its bucket
        r.decode_graph = DecodeGraph(r.model, r.kv_cache, max_num_seqs=8, kernel=kernel, pad_to_buckets=True)
        r.native_rows = 0  # every decode step compiled, the small ones too (the native decode's are eager)
    return r


def _decode(
    runner: LLMRunner, prompts: dict[str, list[int]], tables: dict[str, list[int]], steps: int
) -> list[torch.Tensor]:
    logits: list[torch.Tensor] = []
    compute = runner.model.compute_logits

    def record(hidden: torch.Tensor) -> torch.Tensor:
        out = compute(hidden)
        logits.append(out.clone())
        return out

    runner.model.compute_logits = record  # type: ignore[method-assign]
    news = [protocol.NewRequest(r, p, GREEDY, tables[r], 0, len(p)) for r, p in prompts.items()]
    runner.execute(protocol.Step(0, news, [], []))
    done = {r: len(p) for r, p in prompts.items()}
    for s in range(steps):
        # a request leaves after 2 steps: the batch shrinks from 3 rows (bucket 4) to 2 (bucket 2)
        live = [r for r in prompts if r != "c" or s < 2]
        out = runner.execute(protocol.Step(1 + s, [], [protocol.CachedRequest(r, [], done[r], 1) for r in live], []))
        assert [t.request_id for t in out.sampled] == live
        for r in live:
            done[r] += 1
    return logits[1:]  # the decode steps'


@pytest.mark.parametrize(
    ("kernel", "quantization", "model_type"),
    [("gather", None, "qwen2"), ("paged", None, "qwen2"), ("paged", "int8", "llama")],
)
def test_compiled_decode_matches_eager(
    hf_checkpoint: Any, kernel: str, quantization: str | None, model_type: str
) -> None:
    """int8, on llama (SmolLM2's architecture: tied head, no biases): the Linears int8
    (models/int8_linear.py) in both runners, the kept ones float; on a VNNI CPU the compiled
    layer traces the activations' split and calls oneDNN's GEMM as one opaque op. The split
    (about 16 bits a row) is inductor's fused loop there and eager ops here, and a value on a
    rounding boundary lands one low step (a row's max / 32258) apart: worst measured 7.3e-5
    (logits), 3.1e-5 (K/V); 1.8e-6 and 1.1e-6 without int8."""
    model_dir = hf_checkpoint(model_type)[0]
    rng = random.Random(0)
    # contexts of 3 to 14 tokens: tables from 1 to 5 blocks of 4, scattered
    prompts = {"a": [rng.randrange(256) for _ in range(3)], "b": [rng.randrange(256) for _ in range(9)],
               "c": [rng.randrange(256) for _ in range(13)]}  # fmt: skip
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)
    tables = {r: [free.pop() for _ in range(5)] for r in prompts}
    eager, compiled = (
        _runner(model_dir, False, quantization=quantization),
        _runner(model_dir, True, kernel, quantization),
    )
    want = _decode(eager, prompts, tables, 5)
    got = _decode(compiled, prompts, tables, 5)
    assert [g.shape for g in got] == [w.shape for w in want]
    worst = max((g - w).abs().max().item() for g, w in zip(got, want))
    tol = 1e-4 if quantization is None else 1e-3
    assert worst < tol, worst
    # every real block holds the same K/V; the scratch block (index NUM_BLOCKS) only in the compiled cache
    assert compiled.kv_cache.shape[2] == NUM_BLOCKS + 1
    torch.testing.assert_close(compiled.kv_cache[:, :, :NUM_BLOCKS], eager.kv_cache, rtol=tol / 10, atol=tol / 10)
    assert compiled.decode_graph is not None and compiled.decode_graph.scratch_block == NUM_BLOCKS


def test_a_compile_that_fails_at_start_leaves_the_worker_serving_eagerly(
    hf_checkpoint: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The compiled step is the default: a machine without a C++ compiler (inductor's CPU
    backend needs one) or an op inductor cannot lower must not stop the worker."""
    model_dir = hf_checkpoint("qwen2")[0]

    def broken(self: DecodeGraph) -> None:
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setattr(DecodeGraph, "warm_up", broken)
    spec = protocol.LLMWorkerSpec(model_dir=str(model_dir), device="cpu", num_kv_blocks=NUM_BLOCKS, compile_decode=True)
    with caplog.at_level("WARNING", logger="omni.llm_runner"):
        runner = LLMRunner.from_spec(spec, GroupMember(0, 1, None))
    assert runner.decode_graph is None
    assert "decode runs eagerly: no working C++ compiler found" in caplog.text
    prompts, tables = {"a": [5, 6, 7], "b": [9, 8]}, {"a": [3, 7], "b": [4, 1]}
    got = _decode(runner, prompts, tables, 3)
    assert len(got) == 3
    torch.testing.assert_close(torch.cat(got), torch.cat(_decode(_runner(model_dir, False), prompts, tables, 3)))


def test_decode_steps_the_native_decode_takes_skip_the_compiled_step(hf_checkpoint: Any) -> None:
    """With --compile-decode on the CPU, a decode step of up to native_rows rows runs the model's
    native decode (every layer in one call: faster there), a larger one the compiled step."""
    from gpu_workers.models import small_m_linear

    if not small_m_linear.load():
        pytest.skip("small-M kernels not built here")
    r = LLMRunner(hf_checkpoint("qwen2")[0], block_size=4, num_kv_blocks=NUM_BLOCKS, compile_decode=True)
    r.decode_graph = DecodeGraph(r.model, r.kv_cache, max_num_seqs=16, pad_to_buckets=True)
    assert r.native_rows == small_m_linear.MAX_ROWS_LAYER > 0
    compiled_rows: list[int] = []
    real = r.decode_graph.forward
    r.decode_graph.forward = lambda ids, *a: compiled_rows.append(len(ids)) or real(ids, *a)  # type: ignore[method-assign]
    n = r.native_rows + 1
    prompts = {f"r{i}": [1 + i, 2, 3] for i in range(n)}
    tables = {f"r{i}": [2 * i, 2 * i + 1] for i in range(n)}
    r.execute(protocol.Step(0, [protocol.NewRequest(k, p, GREEDY, tables[k], 0, 3) for k, p in prompts.items()], [], []))
    r.execute(protocol.Step(1, [], [protocol.CachedRequest("r0", [], 3, 1)], []))
    r.execute(protocol.Step(2, [], [protocol.CachedRequest(k, [], 3 + (k == "r0"), 1) for k in prompts], []))
    assert compiled_rows == [n]
