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
