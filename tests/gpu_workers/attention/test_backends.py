"""Attention backends against a dense per-query reference on a paged cache."""

from __future__ import annotations

import random

import pytest
import torch

from gpu_workers.attention.backend import AttentionBackend, SequenceChunk, slot_mapping
from gpu_workers.attention.registry import create_attention_backend
from gpu_workers.attention.torch_sdpa import TorchSDPABackend

HQ, HKV, D = 6, 2, 16


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
