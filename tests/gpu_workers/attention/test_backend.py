"""The attention backend interface and the paged KV layout: where each packed row's K/V is
written (its slot), that exactly those rows are written, and the cache layout check."""

from __future__ import annotations

import pytest
import torch

from gpu_workers.attention.backend import (
    CacheContractError,
    HeadShape,
    SequenceChunk,
    slot_mapping,
    slots_tensor,
    write_kv,
)
from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from tests.gpu_workers.attention.test_backends import CPU, HKV, HQ, D


def test_a_chunk_knows_its_context_and_whether_it_decodes() -> None:
    assert (SequenceChunk(0, 1, 9, [0]).context_len, SequenceChunk(0, 1, 9, [0]).is_decode) == (10, True)
    assert SequenceChunk(0, 1, 0, [0]).is_decode is False  # a one-token prompt is a prefill
    assert SequenceChunk(0, 4, 3, [0, 1]).is_decode is False


def test_each_row_s_slot_is_its_block_times_the_block_size_plus_its_offset() -> None:
    """block_size 4. Request a: positions 2..5 (blocks 7, 3); b: a decode at position 4 (blocks 0, 5)."""
    chunks = [SequenceChunk(0, 4, 2, [7, 3]), SequenceChunk(4, 1, 4, [0, 5])]
    assert slot_mapping(chunks, 4) == [30, 31, 12, 13, 20]
    slots = slots_tensor(chunks, 4, CPU)
    assert slots is not None and slots.dtype == torch.int64 and slots.tolist() == [30, 31, 12, 13, 20]
    stateless = [SequenceChunk(0, 3, 0, []), SequenceChunk(3, 1, 4, [0, 5])]
    assert slot_mapping(stateless, 4) is None and slots_tensor(stateless, 4, CPU) is None


def test_write_kv_writes_exactly_the_rows_slots_name() -> None:
    k_cache, v_cache = torch.zeros(3, 2, 1, 2), torch.zeros(3, 2, 1, 2)  # 3 blocks of 2 slots
    k = torch.tensor([[[1.0, 1.0]], [[2.0, 2.0]]])
    write_kv(k, -k, (k_cache, v_cache), torch.tensor([5, 0]))
    assert k_cache[:, :, 0, 0].tolist() == [[2.0, 0.0], [0.0, 0.0], [0.0, 1.0]]
    assert torch.equal(v_cache, -k_cache)
    with pytest.raises(ValueError, match="needs every chunk's block table"):
        write_kv(k, k, (k_cache, v_cache), None)


def test_supports_is_the_contract_and_the_package() -> None:
    assert TorchSDPABackend.supports(16, CPU, torch.float32, HeadShape(HQ, HKV, D))


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
