"""What every attention backend's tests share: a mixed batch on a paged cache and its dense
per-query reference (run_backend), and the contract of the paged CUDA kernels (their cache
checks on the CPU; their outputs on a GPU). Each backend's own tests are in test_<backend>.py."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

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
from tests.gpu_workers.attention.library_fakes import Signatures, fake_function, load_signatures

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


def fake_varlen(library: str, sigs: Signatures | None = None) -> tuple[Callable[..., torch.Tensor], list[dict[str, Any]]]:
    """The library's flash_attn_varlen_func ("flash_attn" upstream, "vllm_flash_attn" vLLM's
    build) as a fake bound to its recorded signature (library_fakes.py): a keyword it lacks is a
    TypeError. It computes the paged contract with paged_varlen_reference from exactly the
    arguments given (vLLM's build: seqused_k; upstream: cu_seqlens_k). Returns the fake and the
    list its calls' arguments (every parameter, defaults applied) are appended to."""
    calls: list[dict[str, Any]] = []

    def impl(a: dict[str, Any]) -> torch.Tensor:
        calls.append(a)
        q, k, v, cu_q, table = a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["block_table"]
        assert a["causal"] is True and isinstance(cu_q, torch.Tensor) and cu_q.dtype == torch.int32
        scale = float(a["softmax_scale"])
        if table is None:  # no cache: k, v are the packed new rows, one sequence per chunk
            assert torch.equal(a["cu_seqlens_k"], cu_q)
            out = torch.empty_like(q)
            for s, e in zip(cu_q.tolist(), cu_q[1:].tolist()):
                m = PagedVarlenMetadata(e - s, None, torch.tensor([0, e - s]), torch.tensor([e - s]), torch.tensor([0, e - s]),
                                        torch.arange(e - s)[None], e - s, e - s, True)  # fmt: skip
                out[s:e] = paged_varlen_reference(q[s:e], k[s:e, None], v[s:e, None], m, scale)
            return out
        used = a.get("seqused_k")
        if used is None:
            cu_k = a["cu_seqlens_k"]
            used = cu_k[1:] - cu_k[:-1]
        assert table.dtype == torch.int32 and isinstance(used, torch.Tensor)
        assert a["max_seqlen_k"] == int(used.max()) and a["max_seqlen_q"] == int((cu_q[1:] - cu_q[:-1]).max())
        m = PagedVarlenMetadata(q.shape[0], None, cu_q, used, cu_q, table, 0, 0, False)
        return paged_varlen_reference(q, k, v, m, scale)

    return fake_function(sigs or load_signatures(), library, "flash_attn_varlen_func", impl), calls


# The CUDA kernels' test shape: FlashInfer's kernels take head_dim 64, 128 or 256 only (HEAD_DIMS),
# the flash-attn builds any multiple of 8 up to 256; the CPU tests' D = 16 fits none of FlashInfer's.
CUDA_HEADS = HeadShape(HQ, HKV, 64)


@pytest.mark.parametrize("cls", [VllmFlashAttnBackend, FlashAttnBackend, FlashInferBackend])
def test_the_cuda_kernels_test_shape_is_one_every_kernel_takes(cls: type[AttentionBackend]) -> None:
    """On the CPU, what the GPU test below needs: its cache passes each backend's contract (its
    first version used head_dim 16, which FlashInfer refuses, and failed wherever FlashInfer imported)."""
    cls.check_contract(256 if cls is FlashAttnBackend else 16, CUDA, torch.bfloat16, CUDA_HEADS)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["vllm_flash_attn", "flash_attn", "flashinfer"])
def test_the_cuda_kernels_match_their_contract_on_a_mixed_batch(name: str) -> None:
    """bf16 on the GPU: the real kernel against paged_varlen_reference on decodes, a new
    prompt, a later chunk and prefix hits."""
    from tests.gpu_workers.attention.test_flex_paged import mixed_batch

    cls = ATTENTION_BACKENDS[name]
    if cls.importable() is not None:
        pytest.skip(f"{name} is not installed")
    bs = 256 if name == "flash_attn" else 16
    chunks = mixed_batch(bs, num_blocks=64)
    d, t = CUDA_HEADS.head_dim, sum(c.num_query_tokens for c in chunks)
    gen = torch.Generator().manual_seed(0)
    kc, vc = (torch.randn(64, bs, HKV, d, generator=gen).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(t, HQ, d, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(t, HKV, d, generator=gen).to(torch.bfloat16) for _ in range(2))
    kc, vc, q, k, v = (x.to(CUDA) for x in (kc, vc, q, k, v))
    backend = create_attention_backend(name, block_size=bs, device=CUDA, dtype=torch.bfloat16, heads=CUDA_HEADS)
    assert type(backend) is cls, "prepare() fell back: see the warning in the log"
    backend.check_cache((kc, vc), CUDA_HEADS)
    m = build_paged_varlen(chunks, bs, CUDA)
    got = backend.forward(q, k, v, (kc, vc), backend.build_metadata(chunks), d**-0.5)
    expected = paged_varlen_reference(q.cpu(), kc.cpu(), vc.cpu(), PagedVarlenMetadata(
        m.num_tokens, None, m.cu_seqlens_q.cpu(), m.seqused_k.cpu(), m.cu_seqlens_k.cpu(), m.block_table.cpu(),
        m.max_seqlen_q, m.max_seqlen_k, False), d**-0.5)  # fmt: skip
    torch.testing.assert_close(got.float().cpu(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flashinfer_prepares_its_best_kernel_here() -> None:
    """FA3 on sm90 (FA2 elsewhere) builds and runs both shapes: a failure here is what the
    worker would log before falling back to FA2 (or torch SDPA)."""
    from gpu_workers.attention.flashinfer_backend import kernels_for

    if FlashInferBackend.importable() is not None:
        pytest.skip("flashinfer is not installed")
    backend = FlashInferBackend(16, CUDA)
    backend.prepare(torch.bfloat16, CUDA_HEADS)  # raises KernelUnavailable naming each kernel's failure
    assert backend.kernel == kernels_for(CUDA)[0]
