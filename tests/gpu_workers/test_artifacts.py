"""Encoder outputs as store bytes and back: rows and values exactly, bf16 as its bit pattern,
and a payload that is not (rows, hidden) embeddings refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_workers.artifacts import embeddings_from_bytes, embeddings_to_bytes
from omni.shared.store.codec import EMBEDDINGS, decode_tensors, encode_tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_float_embeddings_come_back_exactly(dtype: torch.dtype) -> None:
    x = torch.tensor([[1.5, -2.25, 0.0], [3.0, 1e-3, -7.0]], dtype=dtype)
    back = embeddings_from_bytes(embeddings_to_bytes(x, {"component": "vision"}))
    assert back.dtype == dtype and back.shape == (2, 3)
    assert torch.equal(back, x)


def test_bf16_travels_as_its_bit_pattern() -> None:
    bits = torch.tensor([[0x3FC0, 0x7F80, -0x8000], [0x7FC1, 0x0001, 0x4049]], dtype=torch.int16)
    x = bits.view(torch.bfloat16)  # 1.5, +inf, -0.0, a NaN with a payload, the smallest subnormal, 3.14
    data = embeddings_to_bytes(x, {"component": "audio"})
    tensors, meta = decode_tensors(data)
    assert meta == {"component": "audio", "dtype": "bfloat16"}
    assert tensors[EMBEDDINGS].dtype == np.int16
    back = embeddings_from_bytes(data)
    assert back.dtype == torch.bfloat16 and torch.equal(back.view(torch.int16), bits)


def test_the_caller_s_metadata_is_not_changed() -> None:
    meta = {"component": "vision"}
    embeddings_to_bytes(torch.zeros(1, 2, dtype=torch.bfloat16), meta)
    assert meta == {"component": "vision"}


def test_what_is_not_rows_of_embeddings_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no \(rows, hidden\) embeddings"):
        embeddings_from_bytes(encode_tensors({EMBEDDINGS: np.zeros(4, np.float32)}, {}))
    with pytest.raises(ValueError, match=r"no \(rows, hidden\) embeddings"):
        embeddings_from_bytes(encode_tensors({"other": np.zeros((1, 4), np.float32)}, {}))
    with pytest.raises(ValueError, match="bfloat16 embeddings must be stored as int16"):
        embeddings_from_bytes(encode_tensors({EMBEDDINGS: np.zeros((1, 4), np.float32)}, {"dtype": "bfloat16"}))
