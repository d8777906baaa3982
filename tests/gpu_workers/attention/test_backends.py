"""What every attention backend's tests share: a mixed batch on a paged cache and its dense
per-query reference (run_backend), and the contract of the paged CUDA kernels (their cache
checks on the CPU; their outputs on a GPU). Each backend's own tests are in test_<backend>.py."""

from __future__ import annotations

import random

import pytest
import torch

from gpu_workers.attention.backend import AttentionBackend, CacheContractError, HeadShape, SequenceChunk, slot_mapping
from gpu_workers.attention.flash_attn_backend import FlashAttnBackend, VllmFlashAttnBackend
from gpu_workers.attention.flashinfer_backend import FlashInferBackend
from gpu_workers.attention.paged_varlen import PagedVarlenMetadata, build_paged_varlen, paged_varlen_reference
from gpu_workers.attention.registry import (
    ATTENTION_BACKENDS,
    create_attention_backend,
)

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


@pytest.mark.cuda  # bench/gpu_smoke.sh selects the CUDA tests with -m cuda
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


