"""The compiled decode step against the eager runner on one tiny random model: the same logits
(fp32, worst difference under 1e-4; measured ~3e-6 on the 100M bench model) for batches padded
to their bucket, the same cache contents in every real block (padding rows write only the
scratch block). It compiles once here (a few seconds on a
tiny model; inductor's disk cache keeps it across runs)."""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from gpu_workers.distributed import GroupMember
from gpu_workers.llm.decode_graph import DecodeGraph, decode_buckets, graph_kernel, table_widths
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
    cuda.whole = True  # the CUDA layout: whole-forward graphs, widths rounded up
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


def _recording(graph: DecodeGraph) -> list[tuple[torch.fx.GraphModule, list[Any], list[int]]]:
    """Compile `graph`'s whole-forward step with inductor, recording what inductor's inner compile
    receives: the ATen graph, its example inputs and `static_input_idxs`, the indices that
    cudagraphify (CUDA-graph trees) takes as fixed addresses; it copies every other input into
    graph-owned memory before each replay (torch/_inductor/cudagraph_trees.py)."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    seen: list[tuple[torch.fx.GraphModule, list[Any], list[int]]] = []

    def inner(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        seen.append((gm, list(example_inputs), list(kwargs["static_input_idxs"])))
        return compile_fx_inner(gm, example_inputs, **kwargs)

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        return compile_fx(gm, example_inputs, inner_compile=inner)

    graph._whole = torch.compile(graph._forward, fullgraph=True, backend=backend)  # type: ignore[method-assign]
    return seen


@pytest.fixture
def no_compile_caches() -> Iterator[None]:
    """A hit in AOT autograd's or inductor's disk cache returns the compiled step without an
    inner compile to record: compile afresh."""
    with torch.compiler.config.patch(force_disable_caches=True):  # type: ignore[attr-defined]
        yield


def _numel(t: torch.Tensor) -> int:
    return math.prod(int(s) if isinstance(s, int) else int(s.node.hint) for s in t.shape)


@pytest.mark.parametrize("kernel", ["gather", "reference", "flashinfer"])
def test_the_whole_graph_step_matches_eager_reads_the_cache_static_and_calls_the_library_op(
    hf_checkpoint: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, kernel: str,
    no_compile_caches: None,
) -> None:
    """The CUDA layout on the CPU: the whole forward as one inductor graph, batches padded to
    buckets. (1) Compiled and eager agree. (2) Of the graph's inputs, the KV cache is among those
    inductor hands CUDA-graph trees as static (mark_static_address), as are the weights; what is
    not static is the step's few staged ints. (3) With a library kernel the graph calls
    omni::library_paged_decode once a layer and indexes no cache (no gather); with "gather" it
    does the reverse. (4) flashinfer (a fake taking 0.7.4's names, run computing from the buffers
    plan filled): each step plans its bucket's wrapper once, on the host, then every layer runs it."""
    from tests.gpu_workers.attention.test_library_decode import fake_flashinfer

    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer())
    model_dir = hf_checkpoint("qwen2")[0]
    rng = random.Random(1)
    prompts = {r: [rng.randrange(256) for _ in range(n)] for r, n in (("a", 3), ("b", 9), ("c", 13))}
    tables = {"a": [3, 7, 11, 15, 19], "b": [0, 40, 2, 9, 5], "c": [21, 22, 30, 31, 12]}
    eager = _runner(model_dir, False)
    compiled = _runner(model_dir, True)
    with caplog.at_level("INFO", logger="omni.llm_runner.decode_graph"):
        compiled.decode_graph = graph = DecodeGraph(
            compiled.model, compiled.kv_cache, max_num_seqs=4, kernel=kernel, max_model_len=64, whole_graph=True,
            pad_to_buckets=True,
        )
    seen = _recording(graph)
    want = _decode(eager, prompts, tables, 4)
    got = _decode(compiled, prompts, tables, 4)
    worst = max((g - w).abs().max().item() for g, w in zip(got, want))
    assert worst < 1e-4, worst
    assert seen, "the whole-forward step was not compiled"
    layers = compiled.model_config.num_layers
    kv_shape = tuple(compiled.kv_cache.shape)
    for gm, inputs, static in seen:
        tensors = {i: t for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)}
        cache_inputs = [i for i, t in tensors.items() if tuple(t.shape) == kv_shape]
        assert len(cache_inputs) == 1 and cache_inputs[0] in static
        # not static: the staged ids, positions, lengths, slots and table (4 x 4 + 4 x width int64)
        loose = {i: t for i, t in tensors.items() if i not in static}
        assert loose and all(t.dtype == torch.int64 and _numel(t) <= 4 * 4 + 4 * 16 for t in loose.values()), {
            i: (t.dtype, tuple(t.shape)) for i, t in loose.items()
        }
        targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        ops = sum(t.startswith("omni.library_paged_decode") for t in targets)
        gathers = sum(t == "aten.index.Tensor" for t in targets)
        if kernel == "gather":
            assert ops == 0 and gathers > 0
        else:
            assert ops == layers and gathers == 0, targets
    if kernel == "flashinfer":
        assert graph.library is not None and "BatchDecodeWithPagedKVCacheWrapper" in caplog.text
        wrappers = graph.library.wrappers  # type: ignore[attr-defined]
        assert set(wrappers) == {1, 2, 4} and wrappers[4].indices.numel() == 4 * 16  # 64 tokens / blocks of 4
        for w in wrappers.values():  # plan, then a run a layer, step after step
            assert w.calls == ["plan", *["run"] * layers] * (len(w.calls) // (1 + layers))
        assert wrappers[4].calls and wrappers[2].calls  # 3 rows (bucket 4), then 2 (bucket 2)


def test_the_kv_cache_is_marked_static_through_dynamo(hf_checkpoint: Any) -> None:
    r = _runner(hf_checkpoint("qwen2")[0], True)
    from torch._dynamo.utils import get_static_address_type

    assert get_static_address_type(r.kv_cache) == "unguarded"  # torch._dynamo.mark_static_address(guard=False)


def test_the_graph_kernel_follows_the_eager_attention_backend() -> None:
    cache = torch.zeros(3, 4, 2, 8)
    cuda = torch.device("cuda")
    assert graph_kernel("flashinfer", cuda, cache) == "flashinfer"
    assert graph_kernel("vllm_flash_attn", cuda, cache) == "vllm_flash_attn"
    assert graph_kernel("flash_attn", cuda, cache) == "flash_attn"
    assert graph_kernel("torch_sdpa", cuda, cache) == "gather"  # no paged library kernel
    assert graph_kernel("flashinfer", torch.device("cpu"), cache) in ("paged", "gather")  # the CPU's own


def test_the_runner_gives_its_compiled_step_the_eager_attention_backend(
    hf_checkpoint: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_workers.llm import runner as runner_module

    made: list[dict[str, Any]] = []
    monkeypatch.setattr(runner_module, "DecodeGraph", lambda *a, **kw: made.append(kw))
    r = LLMRunner(hf_checkpoint("qwen2")[0], block_size=4, num_kv_blocks=NUM_BLOCKS, compile_decode=True)
    assert made == [{"max_num_seqs": 64, "kernel": None, "attention_backend": r.attention_backend.name}]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flashinfer", "torch_sdpa"])
def test_on_cuda_the_graphs_copy_no_cache_run_the_library_kernel_and_match_eager(
    tmp_path: Any, backend: str
) -> None:
    """What the CPU tests cannot show (issue 34 items 1, 2), on one GPU: CUDA-graph trees record
    every bucket without copying a 1 GiB KV cache (allocated memory across warm-up far below
    it) and skip no graph; the graphs' attention is FlashInfer's decode wrapper under flashinfer
    (inductor's gather under torch_sdpa); compiled and eager agree on fp16 logits step by step."""
    from torch._dynamo.utils import counters
    from transformers import AutoConfig, AutoModelForCausalLM

    from gpu_workers.attention.flashinfer_backend import FlashInferBackend
    from tests.gpu_workers.conftest import _randomize

    if backend == "flashinfer" and (why := FlashInferBackend.importable()) is not None:
        pytest.skip(why)
    config = AutoConfig.for_model(
        "qwen2", vocab_size=256, hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    )  # fmt: skip  # head_dim 64, one FlashInfer builds
    model = AutoModelForCausalLM.from_config(config)
    _randomize(model.float(), seed=3)
    model.save_pretrained(tmp_path)
    blocks = 1 << 16  # 2 layers x K|V x 16 tokens x 2 heads x 64 x 2 bytes = 16 KiB a block: 1 GiB

    def runner(compiled: bool) -> LLMRunner:
        r = LLMRunner(tmp_path, device="cuda:0", dtype=torch.float16, num_kv_blocks=blocks, attention_backend=backend,
                      compile_decode=compiled, max_num_seqs=4)  # fmt: skip
        mc = r.model_config
        r.attention_backend.warm_up(r.kv_caches[0], mc.num_heads, mc.attention_scale)
        r.native_rows = 0
        return r

    compiled = runner(True)
    graph = compiled.decode_graph
    assert graph is not None and graph.kernel == ("flashinfer" if backend == "flashinfer" else "gather")
    kv_bytes = compiled.kv_cache.numel() * compiled.kv_cache.element_size()
    skips = counters["inductor"]["cudagraph_skips"]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    graph.warm_up()
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before
    assert grown < kv_bytes // 4, f"warm-up grew {grown / 2**20:.0f} MiB over a {kv_bytes / 2**20:.0f} MiB cache"
    assert counters["inductor"]["cudagraph_skips"] == skips
    calls = 0
    real = graph.forward

    def counting(*args: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return real(*args)

    graph.forward = counting  # type: ignore[method-assign]
    rng = random.Random(2)
    prompts = {r: [rng.randrange(256) for _ in range(n)] for r, n in (("a", 5), ("b", 40), ("c", 77))}
    tables = {"a": [1, 2], "b": [10, 11, 12, 13], "c": [20, 21, 22, 23, 24, 25, 26]}
    got = _decode(compiled, prompts, tables, 4)
    want = _decode(runner(False), prompts, tables, 4)
    assert calls == 4
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), atol=2e-2, rtol=2e-2)


def test_a_library_kernel_that_cannot_be_made_leaves_the_graphs_gathering(
    hf_checkpoint: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker must not die (and restart forever) because FlashInfer's decode wrapper refuses."""
    import types

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("no kernel for this GPU")

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(BatchDecodeWithPagedKVCacheWrapper=refuse))
    r = _runner(hf_checkpoint("qwen2")[0], False)
    with caplog.at_level("WARNING", logger="omni.llm_runner.decode_graph"):
        graph = DecodeGraph(r.model, r.kv_cache, max_num_seqs=4, kernel="flashinfer", pad_to_buckets=True)
    assert graph.kernel == "gather" and graph.library is None
    assert "the flashinfer decode kernel is unavailable for the graphs (no kernel for this GPU); they gather" in caplog.text
