import numpy as np
import pytest

from omni.shared.store.codec import (
    artifact_rows,
    decode_codes,
    decode_tensors,
    encode_codes,
    encode_tensors,
    header_size,
)


def test_round_trip() -> None:
    tensors = {
        "embeddings": np.arange(12, dtype=np.float16).reshape(3, 4),
        "codes": np.array([1, 65535, 7], dtype=np.int64),
        "mask": np.array([True, False]),
        "scalar": np.array(2.5, dtype=np.float32),
    }
    data = encode_tensors(tensors, {"component": "vision_encoder", "num_tokens": "3"})
    assert isinstance(data, bytes)
    out, meta = decode_tensors(data)
    assert meta == {"component": "vision_encoder", "num_tokens": "3"}
    assert set(out) == set(tensors)
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        np.testing.assert_array_equal(out[name], t)


def test_non_contiguous_and_no_metadata() -> None:
    t = np.arange(20, dtype=np.float32).reshape(4, 5).T  # a transposed view
    out, meta = decode_tensors(encode_tensors({"t": t}))
    assert meta == {}
    np.testing.assert_array_equal(out["t"], t)


def test_metadata_must_be_strings() -> None:
    with pytest.raises(TypeError):
        encode_tensors({"t": np.zeros(1)}, {"n": 3})  # type: ignore[dict-item]


def test_is_not_pickle() -> None:
    data = encode_tensors({"t": np.zeros(2, dtype=np.float32)})
    assert not data.startswith(b"\x80")  # pickle protocol 2+ opcode
    with pytest.raises(Exception):
        decode_tensors(b"\x80\x04garbage")


def test_artifact_rows_from_the_head_alone() -> None:
    data = encode_tensors({"embeddings": np.zeros((7, 4), dtype=np.float32)})
    head = data[: header_size(data)]
    assert artifact_rows(head, len(data)) == ("embeddings", 7)
    assert artifact_rows(data) == ("embeddings", 7)
    with pytest.raises(ValueError, match="truncated"):
        artifact_rows(head, len(data) - 1)
    with pytest.raises(ValueError, match="truncated"):
        artifact_rows(data[:-1])
    codes = encode_codes([3, 1, 2])
    assert artifact_rows(codes) == ("codes", 3) and decode_codes(codes) == [3, 1, 2]
