"""The paged CPU kernel against a dense softmax in plain torch over each row's context gathered
out of the cache (shuffled block tables, fp32 and bf16 caches, G 1-4, head dims 16/64/128, blocks
of 4 and 16, contexts of 1 and on block boundaries, padding rows on a scratch block). Decode rows:
worst differences 4.8e-7 fp32, 7.2e-7 bf16 cache with an fp32 q, 4.8e-7 bf16 cache with a bf16 q
(the bf16 dot product path; the reference reads the same bf16 values widened). Continuing chunks
(causal within the chunk, tiles of tokens crossing blocks): 7.2e-7 fp32, 8.3e-7 bf16. Asserted
under 3e-6. Then the op inside torch.compile, the eager SDPA backend's decode rows and continuing
chunks against its padded-gather and copied-context paths, and the fallback when the kernel
cannot be built."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.attention import cpu_paged
from gpu_workers.attention.backend import SequenceChunk
from gpu_workers.attention.torch_sdpa import TorchSDPABackend

pytestmark = pytest.mark.skipif(not cpu_paged.available(), reason="no C compiler to build the kernel")


def EVERY_SHAPE(test: Any) -> Any:
    """Both cache dtypes, G 1-4, head dims 16/64/128, blocks of 4 and 16."""
    for name, values in (("dtype", [torch.float32, torch.bfloat16]), ("g", [1, 2, 3, 4]), ("d", [16, 64, 128]),
                         ("bs", [4, 16])):  # fmt: skip
        test = pytest.mark.parametrize(name, values)(test)
    return test


def _reference(q, k_cache, v_cache, table, num_cached, k_new, v_new, scale):  # type: ignore[no-untyped-def]
    """(B, H, G, D): softmax over [the row's first num_cached cached tokens, its own token]."""
    out = torch.zeros(q.shape)
    for b in range(q.shape[0]):
        n = int(num_cached[b])
        keys = k_cache[table[b]].flatten(0, 1)[:n].float()  # (n, H, D)
        values = v_cache[table[b]].flatten(0, 1)[:n].float()
        if k_new is not None:
            keys = torch.cat([keys, k_new[b, None].float()])
            values = torch.cat([values, v_new[b, None].float()])
        if keys.shape[0]:
            p = torch.softmax(torch.einsum("hgd,thd->hgt", q[b].double(), keys.double()) * scale, -1)
            out[b] = torch.einsum("hgt,thd->hgd", p, values.double()).float()
    return out


def _case(dtype: torch.dtype, g: int, d: int, bs: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    h = 2
    # cached tokens per row: none (context 1), one, on block boundaries, one past, a longer one
    cached = [0, 1, bs - 1, bs, 2 * bs, 2 * bs + 1, 5 * bs + 3]
    width = max(-(-n // bs) for n in cached) + 1
    num_blocks = len(cached) * width + 1
    scratch = num_blocks - 1
    free = list(range(scratch))
    rng.shuffle(free)
    table = [[free.pop() for _ in range(-(-n // bs))] for n in cached]
    table = [t + [scratch] * (width - len(t)) for t in table]
    table.append([scratch] * width)  # a bucket's padding row: only the scratch block
    cached.append(0)
    b = len(cached)
    return {
        "q": torch.randn(b, h, g, d, generator=gen),
        "k_cache": torch.randn(num_blocks, bs, h, d, generator=gen).to(dtype),
        "v_cache": torch.randn(num_blocks, bs, h, d, generator=gen).to(dtype),
        "table": torch.tensor(table),
        "num_cached": torch.tensor(cached),
        "k_new": torch.randn(b, h, d, generator=gen).to(dtype),
        "v_new": torch.randn(b, h, d, generator=gen).to(dtype),
    }


@EVERY_SHAPE
def test_kernel_matches_dense_softmax(dtype: torch.dtype, g: int, d: int, bs: int) -> None:
    c = _case(dtype, g, d, bs)
    args = (c["q"], c["k_cache"], c["v_cache"], c["table"], c["num_cached"])
    scale = d**-0.5
    got = cpu_paged.paged_decode_attention(*args, c["k_new"], c["v_new"], scale)
    want = _reference(*args, c["k_new"], c["v_new"], scale)
    assert (got - want).abs().max().item() < 3e-6
    if dtype == torch.bfloat16:  # a bf16 model's q: the kernel dots it with the bf16 keys as stored
        qh = c["q"].to(dtype)
        got = cpu_paged.paged_decode_attention(qh, *args[1:], c["k_new"], c["v_new"], scale)
        want = _reference(qh.float(), *args[1:], c["k_new"], c["v_new"], scale)
        assert (got - want).abs().max().item() < 3e-6
    # without the own token (the eager path: it is in the cache already); rows with nothing: zeros
    got = cpu_paged.paged_decode_attention(*args, None, None, scale)
    want = _reference(*args, None, None, scale)
    assert (got - want).abs().max().item() < 3e-6
    assert not got[c["num_cached"] == 0].any()
    if dtype == torch.bfloat16:  # the eager bf16 path: no fp32 copy of q, the output rounded by the kernel
        fp32_out = cpu_paged.attend(qh, *args[1:], None, None, scale)
        bf16_out = cpu_paged.attend(qh, *args[1:], None, None, scale, out_dtype=torch.bfloat16)
        assert bf16_out.dtype == torch.bfloat16 and torch.equal(bf16_out, fp32_out.to(torch.bfloat16))


def _chunks_reference(q, k_cache, v_cache, table, q_start, q_len, context_lens, scale):  # type: ignore[no-untyped-def]
    """(T, H, G, D): token i of chunk c (position context_lens[c] - q_len[c] + i) over the cache's
    first context_lens[c] - q_len[c] + i + 1 tokens; zeros on the other rows."""
    out = torch.zeros(q.shape)
    for c in range(len(q_start)):
        start, n, ctx = int(q_start[c]), int(q_len[c]), int(context_lens[c])
        keys = k_cache[table[c]].flatten(0, 1)[:ctx].double()  # (ctx, H, D)
        values = v_cache[table[c]].flatten(0, 1)[:ctx].double()
        for i in range(n):
            seen = ctx - n + i + 1
            p = torch.softmax(torch.einsum("hgd,thd->hgt", q[start + i].double(), keys[:seen]) * scale, -1)
            out[start + i] = torch.einsum("hgt,thd->hgd", p, values[:seen]).float()
    return out


def _chunks_case(dtype: torch.dtype, g: int, d: int, bs: int, seed: int = 0) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    h = 2
    # (tokens, context): one token after none or a few, a block's worth, chunks longer than a
    # tile (128 // G tokens: 140 for G 1, 70 for G 2-4) crossing blocks, and longer contexts
    # behind shorter chunks
    specs = [(1, 1), (1, 5), (bs, bs + 3), (33, 40), (20, 23 + 3 * bs), (70, 70 + 2 * bs), (140, 141)]
    width = max(-(-ctx // bs) for _, ctx in specs)
    num_blocks = len(specs) * width
    free = list(range(num_blocks))
    rng.shuffle(free)
    table = [[free.pop() for _ in range(-(-ctx // bs))] for _, ctx in specs]
    starts, row = [], 2  # the chunks sit between other rows of the step (decodes, new prompts)
    for n, _ in specs:
        starts.append(row)
        row += n + 1
    return {
        "q": torch.randn(row, h, g, d, generator=gen),
        "k_cache": torch.randn(num_blocks, bs, h, d, generator=gen).to(dtype),
        "v_cache": torch.randn(num_blocks, bs, h, d, generator=gen).to(dtype),
        "table": torch.tensor([t + [0] * (width - len(t)) for t in table]),
        "q_start": torch.tensor(starts),
        "q_len": torch.tensor([n for n, _ in specs]),
        "context_lens": torch.tensor([ctx for _, ctx in specs]),
        "rows": torch.cat([torch.arange(s, s + n) for s, (n, _) in zip(starts, specs)]),
    }


@EVERY_SHAPE
def test_continuing_chunks_match_dense_causal_softmax(dtype: torch.dtype, g: int, d: int, bs: int) -> None:
    c = _chunks_case(dtype, g, d, bs)
    args = (c["k_cache"], c["v_cache"], c["table"], c["q_start"], c["q_len"], c["context_lens"], d**-0.5)
    rows = c["rows"]
    for q in (c["q"], c["q"].to(dtype)):  # an fp32 q, and a bf16 model's (the bf16 dot product)
        got = cpu_paged.attend_chunks(q, *args)
        want = _chunks_reference(q.float(), *args)
        assert (got[rows] - want[rows]).abs().max().item() < 3e-6


def test_continuing_chunks_threads_agree() -> None:
    c = _chunks_case(torch.float32, 3, 64, 16, seed=4)
    args = (c["q"], c["k_cache"], c["v_cache"], c["table"], c["q_start"], c["q_len"], c["context_lens"], 0.125)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_paged.attend_chunks(*args)[c["rows"]]
        torch.set_num_threads(2)
        two = cpu_paged.attend_chunks(*args)[c["rows"]]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)  # each (chunk, head, tile) is one task: the same arithmetic


def test_bf16_output_keeps_nans_as_torch_does() -> None:
    """A NaN in the cache reaches the output: rounded to bf16 by the kernel it stays a NaN (not
    an infinity, as plain round-to-nearest of its bits would make it)."""
    gen = torch.Generator().manual_seed(5)
    k_cache, v_cache = torch.randn(2, 4, 4, 1, 16, generator=gen).to(torch.bfloat16).unbind(0)
    v_cache[0, 0, 0, 0] = float("nan")
    q = torch.randn(2, 1, 1, 16, generator=gen).to(torch.bfloat16)
    args = (q, k_cache, v_cache, torch.tensor([[0], [1]]), torch.tensor([3, 3]), None, None, 0.25)
    fp32_out = cpu_paged.attend(*args)
    bf16_out = cpu_paged.attend(*args, out_dtype=torch.bfloat16)
    assert fp32_out[0, 0, 0, 0].isnan() and bf16_out[0, 0, 0, 0].isnan()
    assert torch.equal(bf16_out.isnan(), fp32_out.isnan())
    assert torch.equal(bf16_out.nan_to_num(), fp32_out.to(torch.bfloat16).nan_to_num())


def test_threads_agree() -> None:
    c = _case(torch.float32, 3, 64, 16, seed=1)
    args = (c["q"], c["k_cache"], c["v_cache"], c["table"], c["num_cached"], c["k_new"], c["v_new"], 0.125)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_paged.paged_decode_attention(*args)
        torch.set_num_threads(2)
        two = cpu_paged.paged_decode_attention(*args)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)  # each (row, head) is one task: the same arithmetic


def test_op_inside_torch_compile_equals_eager() -> None:
    c = _case(torch.bfloat16, 2, 16, 4, seed=2)

    def step(q: torch.Tensor, k_new: torch.Tensor) -> torch.Tensor:
        out = cpu_paged.paged_decode_attention(
            q * 2.0, c["k_cache"], c["v_cache"], c["table"], c["num_cached"], k_new, c["v_new"], 0.25
        )
        return out.sum(-1)

    compiled = torch.compile(step, fullgraph=True)
    torch.testing.assert_close(compiled(c["q"], c["k_new"]), step(c["q"], c["k_new"]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_backend_decode_rows_read_the_cache_in_place(dtype: torch.dtype) -> None:
    """torch_sdpa's decode rows through the kernel (which also writes their K/V, in the same call)
    equal its padded gather + masked SDPA after write_kv, and leave the same cache; k and v are
    views into one fused projection, as the models pass them."""
    gen = torch.Generator().manual_seed(3)
    bs, hq, hkv, d = 4, 6, 2, 16
    k_cache, v_cache = torch.randn(2, 20, bs, hkv, d, generator=gen).to(dtype).unbind(0)
    chunks = [SequenceChunk(0, 1, 6, [3, 9]), SequenceChunk(1, 1, 8, [1, 4, 7]), SequenceChunk(2, 1, 2, [12])]
    qkv = torch.randn(3, (hq + 2 * hkv) * d, generator=gen).to(dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=1)
    q, k, v = q.reshape(3, hq, d), k.view(3, hkv, d), v.view(3, hkv, d)
    results = []
    for paged in (True, False):
        backend = TorchSDPABackend(bs, torch.device("cpu"))
        backend.paged_kernel = paged
        meta = backend.build_metadata(chunks)
        assert (meta.decode.mask is None) == paged
        cache = (k_cache.clone(), v_cache.clone())
        results.append((backend.forward(q, k, v, cache, meta, 0.25), cache))
    (got, got_cache), (want, want_cache) = results
    assert (got.float() - want.float()).abs().max().item() < (1e-5 if dtype == torch.float32 else 1.6e-2)
    assert torch.equal(got_cache[0], want_cache[0]) and torch.equal(got_cache[1], want_cache[1])
    assert not torch.equal(got_cache[0], k_cache)  # the rows were written


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 2e-6), (torch.bfloat16, 1.6e-2)])
def test_sdpa_backend_mixed_step_reads_the_cache_in_place(dtype: torch.dtype, tol: float) -> None:
    """A step of decodes, a new prompt, a later chunk of a long prompt and prefix-cache hits:
    through the kernel (decodes and continuing chunks in place, no mask) it equals the padded
    gather and copied-context SDPA path, and writes the same cache."""
    from tests.gpu_workers.attention.test_flex_paged import filled_cache, mixed_batch

    bs = 16
    chunks = mixed_batch(bs)
    (kc, vc), q, k, v = filled_cache(chunks, bs, dtype)
    results = []
    for paged in (True, False):
        backend = TorchSDPABackend(bs, torch.device("cpu"))
        backend.paged_kernel = paged
        meta = backend.build_metadata(chunks)
        assert (meta.continuing is not None) == paged and (meta.decode is not None and meta.decode.mask is None) == paged
        cache = (kc.clone(), vc.clone())
        results.append((backend.forward(q, k, v, cache, meta, 0.125), cache))
        if paged:  # nothing built for the SDPA path's continuing chunks
            assert all(p.mask is None for p in meta.prefills)
    (got, got_cache), (want, want_cache) = results
    assert (got.float() - want.float()).abs().max().item() < tol
    assert torch.equal(got_cache[0], want_cache[0]) and torch.equal(got_cache[1], want_cache[1])


def test_unbuildable_kernel_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A missing compiler: one log line, available() False, and decode rows take the padded gather."""
    from gpu_workers.attention.compiled_decode import default_kernel

    monkeypatch.setenv("CC", "no-such-compiler-omni")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpu_paged, "_lib", None)
    monkeypatch.setattr(cpu_paged, "_tried", False)
    assert not cpu_paged.available()
    k_cache = torch.zeros(4, 4, 2, 16)
    assert not cpu_paged.supports(k_cache) and default_kernel(k_cache) == "gather"
    backend = TorchSDPABackend(4, torch.device("cpu"))
    meta = backend.build_metadata([SequenceChunk(0, 1, 3, [2])])
    assert meta.decode.mask is not None
    q = torch.randn(1, 4, 16)
    out = backend.forward(q, torch.randn(1, 2, 16), torch.randn(1, 2, 16), (k_cache, k_cache.clone()), meta, 0.25)
    assert out.shape == q.shape


def test_concurrent_builds_share_one_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(cpu_paged.build())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(paths) == 2 and paths[0] == paths[1]
    assert [p.name for p in paths[0].parent.iterdir()] == [paths[0].name]  # no temporary left behind


def test_runner_serves_with_and_without_the_kernel(hf_checkpoint: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The eager LLM runner samples the same greedy tokens and writes the same cache (within
    1e-4) when the kernel reads its cache and when it could not be built (a missing compiler: the
    padded gather and copied contexts). Request a's prompt comes in two chunks (the second one
    continues it); b is a prefix-cache hit on a's first two blocks, prefilled beside a's decodes."""
    from gpu_workers.llm.runner import LLMRunner
    from omni.shared import protocol

    model_dir = hf_checkpoint("qwen2")[0]
    greedy = protocol.SamplingOptions(temperature=0.0)

    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]

    def runner_layers(path: Any) -> int:
        import json

        return int(json.loads((Path(path) / "config.json").read_text())["num_hidden_layers"])

    def run() -> tuple[list[int], torch.Tensor]:
        runner = LLMRunner(model_dir, block_size=4, num_kv_blocks=16)
        runner.attention_backend.warm_up(runner.kv_caches[0], 4, 0.125)
        runner.execute(protocol.Step(0, [protocol.NewRequest("a", prompt, greedy, [7, 2, 9, 11], 0, 6)], [], []))
        out = runner.execute(protocol.Step(1, [], [protocol.CachedRequest("a", [], 6, 5)], []))
        tokens = [out.sampled[0].token_id]
        b = protocol.NewRequest("b", prompt[:8] + [8, 8, 4], greedy, [7, 2, 5, 6], 8, 3)
        out = runner.execute(protocol.Step(2, [b], [protocol.CachedRequest("a", [], 11, 1)], []))
        tokens += [r.token_id for r in out.sampled]
        for s in range(3):
            out = runner.execute(protocol.Step(3 + s, [], [protocol.CachedRequest("a", [], 12 + s, 1)], []))
            tokens.append(out.sampled[0].token_id)
        return tokens, runner.kv_cache.clone()

    calls: list[int] = []
    real = cpu_paged.attend_chunks
    monkeypatch.setattr(cpu_paged, "attend_chunks", lambda *a: calls.append(1) or real(*a))
    with_kernel = run()
    assert len(calls) == 2 * runner_layers(model_dir)  # a's second chunk and b's: every layer
    monkeypatch.setenv("CC", "no-such-compiler-omni")
    monkeypatch.setenv("XDG_CACHE_HOME", "/nonexistent-omni")
    monkeypatch.setattr(cpu_paged, "_lib", None)
    monkeypatch.setattr(cpu_paged, "_tried", False)
    without = run()
    assert not cpu_paged.available()
    assert with_kernel[0] == without[0]
    torch.testing.assert_close(with_kernel[1], without[1], rtol=1e-4, atol=1e-4)
