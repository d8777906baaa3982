"""The compiled decode step's attention, run eagerly (no compile here), against torch's SDPA over
each row's context copied out of the paged cache, for each kernel: worst difference under 1e-5
in fp32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpu_workers.attention import cpu_paged
from gpu_workers.attention.compiled_decode import DecodeGraphMetadata, decode_attention, write_new_kv

KERNELS = ["gather", pytest.param("paged", marks=pytest.mark.skipif(not cpu_paged.available(), reason="no kernel"))]


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_attention_matches_sdpa_over_the_copied_context(kernel: str) -> None:
    gen = torch.Generator().manual_seed(0)
    nb, bs, hkv, g, d = 12, 4, 2, 3, 8
    k_cache = torch.randn(nb, bs, hkv, d, generator=gen)
    v_cache = torch.randn(nb, bs, hkv, d, generator=gen)
    # rows with 0 (a padding row: only its own token), 3, 4 and 9 cached tokens
    tables = [[11, 11, 11], [5, 11, 11], [7, 2, 11], [0, 3, 9]]
    cached = [0, 3, 4, 9]
    b = len(tables)
    q = torch.randn(b, hkv * g, d, generator=gen)
    k = torch.randn(b, hkv, d, generator=gen)
    v = torch.randn(b, hkv, d, generator=gen)
    meta = DecodeGraphMetadata(torch.tensor(tables), torch.tensor(cached) + 1, bs, kernel)
    got = decode_attention(q, k, v, (k_cache, v_cache), meta, scale=0.3)
    assert len(meta.new_kv) == 1 and meta.new_kv[0][0] is not None
    for row in range(b):
        n = cached[row]
        keys = k_cache[tables[row]].reshape(-1, hkv, d)[:n]
        values = v_cache[tables[row]].reshape(-1, hkv, d)[:n]
        keys = torch.cat([keys, k[row, None]]).transpose(0, 1)  # (Hkv, n + 1, D)
        values = torch.cat([values, v[row, None]]).transpose(0, 1)
        qr = q[row].view(hkv, g, d)
        want = F.scaled_dot_product_attention(qr, keys, values, scale=0.3).reshape(hkv * g, d)
        assert (got[row] - want).abs().max().item() < 1e-5


def test_new_kv_lands_in_its_slots_only() -> None:
    kv = torch.zeros(3, 2, 5, 4, 2, 8)  # (L, K|V, blocks, block_size, Hkv, D)
    new = torch.randn(3, 2, 2, 2, 8)  # (L, K|V, B, Hkv, D)
    write_new_kv(kv, new, torch.tensor([6, 19]))  # block 1 slot 2, block 4 slot 3
    assert torch.equal(kv[:, :, 1, 2], new[:, :, 0]) and torch.equal(kv[:, :, 4, 3], new[:, :, 1])
    assert torch.count_nonzero(kv) == torch.count_nonzero(new)  # nothing else written (a sum compared exactly was order-dependent)
