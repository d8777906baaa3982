"""Attention backends against a dense per-query reference on a paged cache."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpu_workers.attention import cpu_paged
from gpu_workers.attention.backend import AttentionBackend, CacheContractError, HeadShape, SequenceChunk, slot_mapping
from gpu_workers.attention.flash_attn_backend import FlashAttnBackend, VllmFlashAttnBackend
from gpu_workers.attention.flashinfer_backend import FlashInferBackend
from gpu_workers.attention.paged_varlen import PagedVarlenMetadata, build_paged_varlen, paged_varlen_reference
from gpu_workers.attention.registry import (
    ATTENTION_BACKENDS,
    CUDA_AUTO_ORDER,
    auto_backend_name,
    create_attention_backend,
)
from gpu_workers.attention.torch_sdpa import TorchSDPABackend

HQ, HKV, D = 6, 2, 16
CPU = torch.device("cpu")


def scenario(block_size: int, num_blocks: int, seed: int = 0) -> tuple[list[SequenceChunk], list[torch.Tensor], list[torch.Tensor]]:
    """Decodes, a fresh prefill and a continued prefill, with shuffled block tables."""
    rng = random.Random(seed)
    free = list(range(num_blocks))
    rng.shuffle(free)
    # (num_computed, num_query): decode, fresh prefill, continued chunk, decode at a block
    # edge, a second decode, a one-token prompt
    shapes = [(9, 1), (0, 7), (5, 6), (2 * block_size - 1, 1), (1, 1), (0, 1)]
    gen = torch.Generator().manual_seed(seed)
    chunks, keys, values = [], [], []
    start = 0
    for computed, n in shapes:
        blocks = [free.pop() for _ in range(-(-(computed + n) // block_size))]
        chunks.append(SequenceChunk(start, n, computed, blocks))
        keys.append(torch.randn(computed + n, HKV, D, generator=gen))
        values.append(torch.randn(computed + n, HKV, D, generator=gen))
        start += n
    return chunks, keys, values


def reference(q: torch.Tensor, chunks: list[SequenceChunk], keys: list[torch.Tensor],
              values: list[torch.Tensor], scale: float) -> torch.Tensor:  # fmt: skip
    out = torch.empty_like(q)
    for c, k, v in zip(chunks, keys, values):
        for i in range(c.num_query_tokens):
            row, pos = c.query_start + i, c.num_computed_tokens + i
            for h in range(HQ):
                kh, vh = k[: pos + 1, h // (HQ // HKV)], v[: pos + 1, h // (HQ // HKV)]
                out[row, h] = ((q[row, h] @ kh.T) * scale).softmax(-1) @ vh
    return out


def run_backend(backend: AttentionBackend, device: str, dtype: torch.dtype, block_size: int) -> None:
    num_blocks = 64
    chunks, keys, values = scenario(block_size, num_blocks)
    k_cache = torch.zeros(num_blocks, block_size, HKV, D)
    v_cache = torch.zeros_like(k_cache)
    # history already in the cache: positions [0, num_computed) of every chunk
    for c, k, v in zip(chunks, keys, values):
        for p in range(c.num_computed_tokens):
            b, o = c.block_ids[p // block_size], p % block_size
            k_cache[b, o], v_cache[b, o] = k[p], v[p]
    new_k = torch.cat([k[c.num_computed_tokens :] for c, k in zip(chunks, keys)])
    new_v = torch.cat([v[c.num_computed_tokens :] for c, v in zip(chunks, values)])
    q = torch.randn(new_k.shape[0], HQ, D, generator=torch.Generator().manual_seed(1))
    scale = 0.3
    expected = reference(q, chunks, keys, values, scale)

    kv = (k_cache.to(device, dtype), v_cache.to(device, dtype))
    meta = backend.build_metadata(chunks)
    got = backend.forward(q.to(device, dtype), new_k.to(device, dtype), new_v.to(device, dtype), kv, meta, scale)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float().cpu(), expected, atol=tol, rtol=tol)
    # the new tokens' K/V landed in their slots
    slots = torch.tensor(slot_mapping(chunks, block_size))
    torch.testing.assert_close(kv[0].float().cpu().view(-1, HKV, D)[slots], new_k, atol=tol, rtol=tol)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_torch_sdpa_matches_reference(block_size: int) -> None:
    run_backend(TorchSDPABackend(block_size, torch.device("cpu")), "cpu", torch.float32, block_size)


def test_auto_on_cpu() -> None:
    """torch SDPA, which starts at once (flex_paged is chosen by name: it compiles at start)."""
    backend = create_attention_backend("auto", block_size=16, device=torch.device("cpu"), dtype=torch.float32)
    assert type(backend) is TorchSDPABackend


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_sdpa_on_cuda() -> None:
    run_backend(TorchSDPABackend(4, torch.device("cuda")), "cuda", torch.float32, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flash_attn_matches_reference() -> None:
    pytest.importorskip("flash_attn")
    backend = create_attention_backend("flash_attn", block_size=256, device=torch.device("cuda"), dtype=torch.bfloat16)
    run_backend(backend, "cuda", torch.bfloat16, 256)


# --- the CUDA paged kernels' contract, checked on the CPU -------------------------------------

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU
HEADS = HeadShape(32, 8, 128)


@pytest.mark.parametrize("cls", [VllmFlashAttnBackend, FlashAttnBackend, FlashInferBackend])
def test_a_cache_the_kernel_cannot_take_is_refused_naming_what(cls: type[AttentionBackend]) -> None:
    ok_block = {"vllm_flash_attn": 16, "flash_attn": 256, "flashinfer": 16}[cls.name]
    cls.check_contract(ok_block, CUDA, torch.bfloat16, HEADS)  # fits: no error
    cases = [
        ((ok_block, CUDA, torch.float32, HEADS), "dtype torch.float32"),
        ((ok_block, CPU, torch.bfloat16, HEADS), "device cpu"),
        ((ok_block, CUDA, torch.float16, HeadShape(12, 5, 128)), "12 query heads over 5 KV heads"),
        ((ok_block, CUDA, torch.float16, HeadShape(8, 8, 260 if cls.name != "flashinfer" else 96)), "head_dim"),
    ]
    if cls.name != "flashinfer":  # FlashInfer takes any block size
        cases.append(((ok_block + 8, CUDA, torch.bfloat16, HEADS), f"block_size {ok_block + 8}"))
    for args, named in cases:
        with pytest.raises(CacheContractError, match=f"{cls.name!r} cannot take this KV cache: {named}") as e:
            cls.check_contract(*args)
        assert e.value.args[0].count(";") == 0, "only the one mismatch is named"


def test_the_kv_layout_is_checked_on_the_allocated_cache() -> None:
    backend = TorchSDPABackend(16, CPU)
    heads = HeadShape(HQ, HKV, D)
    cache = torch.zeros(2, 2, 8, 16, HKV, D)
    backend.check_cache((cache[0, 0], cache[0, 1]), heads)  # the runner's layout fits
    with pytest.raises(CacheContractError, match=r"is \(8, 16, 4, 16\), not \(num_blocks, 16, 2, 16\) \(KV layout\)"):
        backend.check_cache((torch.zeros(8, 16, 4, D),) * 2, heads)
    hnd = torch.zeros(8, HKV, 16, D).transpose(1, 2)  # heads-major pages seen through a view
    with pytest.raises(CacheContractError, match="strides .* \\(KV layout\\)"):
        backend.check_cache((hnd, hnd), heads)


def test_a_kernel_whose_package_is_missing_is_not_selectable() -> None:
    """None of the CUDA kernel packages is installed here: named, each is refused with the
    reason; auto on CUDA then falls back to torch SDPA."""
    for name in ("vllm_flash_attn", "flash_attn", "flashinfer"):
        cls = ATTENTION_BACKENDS[name]
        if cls.importable() is None:
            pytest.skip(f"{name} is installed")
        block = 256 if name == "flash_attn" else 16
        with pytest.raises(ValueError, match=f"{name!r} is not available here: .*cannot be imported"):
            create_attention_backend(name, block_size=block, device=CUDA, dtype=torch.bfloat16, heads=HEADS)
    assert auto_backend_name(16, CUDA, torch.bfloat16, HEADS) == "torch_sdpa"


def test_auto_on_cuda_takes_the_first_kernel_that_is_installed_and_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    installed: set[str] = set()
    for cls in CUDA_AUTO_ORDER:
        monkeypatch.setattr(cls, "importable", classmethod(lambda c: None if c.name in installed else "absent"))
    installed.update({"flash_attn", "flashinfer"})
    assert auto_backend_name(16, CUDA, torch.bfloat16, HEADS) == "flashinfer"  # FA2 needs 256-token blocks
    assert auto_backend_name(256, CUDA, torch.bfloat16, HEADS) == "flash_attn"
    assert auto_backend_name(16, CUDA, torch.bfloat16, HeadShape(8, 8, 96)) == "torch_sdpa"  # no kernel's head_dim
    installed.add("vllm_flash_attn")
    assert auto_backend_name(16, CUDA, torch.bfloat16, HEADS) == "vllm_flash_attn"
    assert auto_backend_name(16, CUDA, torch.float32, HEADS) == "torch_sdpa"
    assert auto_backend_name(16, CPU, torch.bfloat16, HEADS) == "torch_sdpa"


class FakeVarlen:
    """flash_attn_varlen_func's paged contract computed by paged_varlen_reference, from exactly
    the arguments the backend passes (vLLM's build: seqused_k; upstream: cu_seqlens_k)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
        self.calls.append(kw)
        assert kw["causal"] is True
        cu_q = kw["cu_seqlens_q"]
        assert isinstance(cu_q, torch.Tensor) and cu_q.dtype == torch.int32
        table = kw.get("block_table")
        if table is None:  # no cache: k, v are the packed new rows, one sequence per chunk
            out = torch.empty_like(q)
            for s, e in zip(cu_q.tolist(), cu_q[1:].tolist()):
                m = PagedVarlenMetadata(e - s, None, torch.tensor([0, e - s]), torch.tensor([e - s]), torch.tensor([0, e - s]),
                                        torch.arange(e - s)[None], e - s, e - s, True)  # fmt: skip
                out[s:e] = paged_varlen_reference(q[s:e], k[s:e, None], v[s:e, None], m, float(kw["softmax_scale"]))  # type: ignore[arg-type]
            return out
        used = kw.get("seqused_k")
        if used is None:
            cu_k = kw["cu_seqlens_k"]
            assert isinstance(cu_k, torch.Tensor)
            used = cu_k[1:] - cu_k[:-1]
        assert isinstance(table, torch.Tensor) and table.dtype == torch.int32 and isinstance(used, torch.Tensor)
        assert kw["max_seqlen_k"] == int(used.max()) and kw["max_seqlen_q"] == int((cu_q[1:] - cu_q[:-1]).max())
        m = PagedVarlenMetadata(q.shape[0], None, cu_q, used, cu_q, table, 0, 0, False)
        return paged_varlen_reference(q, k, v, m, float(kw["softmax_scale"]))  # type: ignore[arg-type]


@pytest.mark.parametrize(("cls", "block_size"), [(VllmFlashAttnBackend, 4), (VllmFlashAttnBackend, 16), (FlashAttnBackend, 16)])
def test_the_flash_backends_feed_their_kernel_one_call_per_layer(
    monkeypatch: pytest.MonkeyPatch, cls: type[AttentionBackend], block_size: int
) -> None:
    """With the kernel replaced by its contract in plain torch, the backend (metadata, cache
    writes, arguments) gives the dense reference's outputs, in ONE kernel call per layer for
    the whole mixed batch (C9). Worst difference measured: 4.8e-7 (fp32)."""
    fake = FakeVarlen()
    monkeypatch.setattr(cls, "_import", classmethod(lambda c: fake))
    run_backend(cls(block_size, CPU), "cpu", torch.float32, block_size)
    assert len(fake.calls) == 1
    assert ("seqused_k" in fake.calls[0]) == (cls is VllmFlashAttnBackend)


def test_the_flash_backends_run_a_stateless_forward_as_plain_varlen(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeVarlen()
    monkeypatch.setattr(VllmFlashAttnBackend, "_import", classmethod(lambda c: fake))
    backend = VllmFlashAttnBackend(16, CPU)
    chunks = [SequenceChunk(0, 5, 0, []), SequenceChunk(5, 3, 0, [])]
    gen = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(8, HQ, D, generator=gen), torch.randn(8, HKV, D, generator=gen), torch.randn(8, HKV, D, generator=gen)
    got = backend.forward(q, k, v, None, backend.build_metadata(chunks), 0.3)
    expected = reference(q, chunks, [k[:5], k[5:]], [v[:5], v[5:]], 0.3)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(fake.calls) == 1 and "block_table" not in fake.calls[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["vllm_flash_attn", "flash_attn", "flashinfer"])
def test_the_cuda_kernels_match_their_contract_on_a_mixed_batch(name: str) -> None:
    """bf16 on the GPU: the real kernel against paged_varlen_reference on decodes, a new
    prompt, a later chunk and prefix hits."""
    from tests.gpu_workers.attention.test_flex_paged import filled_cache, mixed_batch

    cls = ATTENTION_BACKENDS[name]
    if cls.importable() is not None:
        pytest.skip(f"{name} is not installed")
    bs = 256 if name == "flash_attn" else 16
    chunks = mixed_batch(bs, num_blocks=64)
    (kc, vc), q, k, v = filled_cache(chunks, bs, torch.bfloat16)
    kc, vc, q, k, v = (t.to(CUDA) for t in (kc, vc, q, k, v))
    backend = create_attention_backend(name, block_size=bs, device=CUDA, dtype=torch.bfloat16, heads=HeadShape(HQ, HKV, D))
    backend.check_cache((kc, vc), HeadShape(HQ, HKV, D))
    m = build_paged_varlen(chunks, bs, CUDA)
    got = backend.forward(q, k, v, (kc, vc), backend.build_metadata(chunks), 0.125)
    expected = paged_varlen_reference(q.cpu(), kc.cpu(), vc.cpu(), PagedVarlenMetadata(
        m.num_tokens, None, m.cu_seqlens_q.cpu(), m.seqused_k.cpu(), m.cu_seqlens_k.cpu(), m.block_table.cpu(),
        m.max_seqlen_q, m.max_seqlen_k, False), 0.125)  # fmt: skip
    torch.testing.assert_close(got.float().cpu(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("paged", [False, pytest.param(True, marks=pytest.mark.skipif(not cpu_paged.available(), reason="no kernel"))])
def test_continuing_chunks_and_prefix_hits_never_need_the_math_kernel(monkeypatch: pytest.MonkeyPatch, paged: bool) -> None:
    """A5: a later chunk of a prompt and prefix-cache hits (GQA 6/2) run with SDPA's math kernel
    excluded, give the previous path's outputs (GQA with a boolean mask, math allowed), and no
    SDPA call passes a mask together with fewer K/V heads than query heads (the pairing CUDA
    sends to the math kernel). Worst difference against the previous path: 6e-8 (fp32). With the
    paged CPU kernel (issue 23) no SDPA call is made and no mask built: the chunks read the cache
    in place, within 1e-6 of the same previous path."""
    from tests.gpu_workers.attention.test_flex_paged import filled_cache, mixed_batch

    bs = 4
    chunks = [c for c in mixed_batch(bs) if c.num_computed_tokens > 0 and c.num_query_tokens > 1]
    chunks = [SequenceChunk(sum(x.num_query_tokens for x in chunks[:i]), c.num_query_tokens, c.num_computed_tokens,
                            c.block_ids) for i, c in enumerate(chunks)]  # fmt: skip
    (kc, vc), q, k, v = filled_cache(chunks, bs, torch.float32)
    backend = TorchSDPABackend(bs, CPU)
    backend.paged_kernel = paged
    meta = backend.build_metadata(chunks)
    assert all(p.block_ids is not None for p in meta.prefills) and len(meta.prefills) == len(chunks) == 2
    assert (meta.continuing is not None) == paged
    real = F.scaled_dot_product_attention
    calls: list[tuple[int, int, bool]] = []

    def recording(q_: torch.Tensor, k_: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append((q_.shape[1], k_.shape[1], kwargs.get("attn_mask") is not None))
        return real(q_, k_, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        got = backend.forward(q, k, v, (kc, vc), meta, 0.125)
    if paged:
        assert not calls and all(p.mask is None and p.folded_mask is None for p in meta.prefills)
    else:
        assert calls and all(hq == hkv for hq, hkv, masked in calls if masked)
    # the previous path: per chunk, GQA SDPA over the chunk's gathered context with a bool mask
    for p in meta.prefills:
        assert p.block_ids is not None
        p.mask = p.causal_mask(CPU)
        kp = kc[p.block_ids].reshape(-1, HKV, D)[: p.context_len].transpose(0, 1)[None]
        vp = vc[p.block_ids].reshape(-1, HKV, D)[: p.context_len].transpose(0, 1)[None]
        old = real(q[p.start : p.end].transpose(0, 1)[None], kp, vp, attn_mask=p.mask, scale=0.125, enable_gqa=True)
        torch.testing.assert_close(got[p.start : p.end], old[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
