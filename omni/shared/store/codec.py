"""Tensors <-> bytes for the store: safetensors through its numpy API, never pickle."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

import numpy as np
from safetensors.numpy import load, save


def encode_tensors(
    tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> bytes:
    meta = dict(metadata or {})
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"safetensors metadata must map str to str, got {k!r}: {v!r}")
    # Not np.ascontiguousarray: it turns a 0-d array into shape (1,).
    arrays = {n: t if t.flags.c_contiguous else t.copy(order="C") for n, t in tensors.items()}
    return save(arrays, metadata=meta)


def decode_tensors(data: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    tensors = load(data)
    # Layout: u64 little-endian header length N, then N bytes of JSON header holding the
    # optional "__metadata__" map; load() does not return it, so read it here.
    (header_len,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + header_len])
    return tensors, dict(header.get("__metadata__") or {})


# ---- encoder artifacts --------------------------------------------------------------------
# An encoder output is one safetensors file holding either "embeddings" (rows, hidden) or
# "codes" (n,) int32. numpy has no bfloat16, so bf16 embeddings travel as their int16 bit
# pattern with metadata {"dtype": "bfloat16"}; the LLM worker views them back losslessly.
EMBEDDINGS = "embeddings"
CODES = "codes"


def header_size(head: bytes) -> int:
    """Bytes from the start of a safetensors file to the end of its JSON header."""
    if len(head) < 8:
        raise ValueError("not a safetensors artifact: shorter than its header length")
    (header_len,) = struct.unpack_from("<Q", head, 0)
    return 8 + int(header_len)


def read_header(data: bytes) -> dict[str, object]:
    """The safetensors JSON header (shapes, dtypes, __metadata__) without loading tensors;
    data may stop right after the header."""
    header_len = header_size(data) - 8
    if header_len > len(data) - 8:
        raise ValueError("not a safetensors artifact: header runs past the end")
    header = json.loads(data[8 : 8 + header_len])
    if not isinstance(header, dict):
        raise ValueError("not a safetensors artifact: header is not an object")
    return header


def artifact_rows(data: bytes, total_size: int | None = None) -> tuple[str, int]:
    """(EMBEDDINGS or CODES, number of rows) of an encoder artifact, from its header alone.

    data: the artifact, or just its head (through the header) when total_size gives the
    artifact's full size. ValueError when that size falls short of what the header describes.
    """
    header = read_header(data)
    ends = [
        int(e["data_offsets"][1])
        for k, e in header.items()
        if k != "__metadata__" and isinstance(e, dict) and isinstance(e.get("data_offsets"), list)
    ]
    size = len(data) if total_size is None else total_size
    if header_size(data) + max(ends, default=0) > size:
        raise ValueError("encoder artifact is truncated")
    for name in (EMBEDDINGS, CODES):
        entry = header.get(name)
        if isinstance(entry, dict) and isinstance(entry.get("shape"), list) and entry["shape"]:
            return name, int(entry["shape"][0])
    raise ValueError("encoder artifact holds neither embeddings nor codes")


def encode_codes(codes: list[int], metadata: Mapping[str, str] | None = None) -> bytes:
    return encode_tensors({CODES: np.asarray(codes, dtype=np.int32)}, metadata)


def decode_codes(data: bytes) -> list[int]:
    tensors, _ = decode_tensors(data)
    if CODES not in tensors:
        raise ValueError("encoder artifact holds no codes")
    return [int(c) for c in tensors[CODES].reshape(-1)]
