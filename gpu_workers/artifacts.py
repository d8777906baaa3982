"""Encoder outputs as artifact-store bytes and back, on the torch side (omni/shared/store/codec.py
holds the format and the numpy-only readers the server uses)."""

from __future__ import annotations

import numpy as np
import torch

from omni.shared.store.codec import EMBEDDINGS, decode_tensors, encode_tensors


def embeddings_to_bytes(x: torch.Tensor, metadata: dict[str, str]) -> bytes:
    """x (rows, hidden) -> safetensors bytes; bf16 is kept exactly as its bit pattern."""
    x = x.detach().to("cpu").contiguous()
    meta = dict(metadata)
    if x.dtype == torch.bfloat16:
        array = x.view(torch.int16).numpy()
        meta["dtype"] = "bfloat16"
    else:
        array = x.numpy()
    return encode_tensors({EMBEDDINGS: array}, meta)


def embeddings_from_bytes(data: bytes) -> torch.Tensor:
    tensors, meta = decode_tensors(data)
    array = tensors.get(EMBEDDINGS)
    if array is None or array.ndim != 2:
        raise ValueError("encoder artifact holds no (rows, hidden) embeddings")
    x = torch.from_numpy(np.ascontiguousarray(array))
    if meta.get("dtype") == "bfloat16":
        if x.dtype != torch.int16:
            raise ValueError("bfloat16 embeddings must be stored as int16 bit patterns")
        return x.view(torch.bfloat16)
    return x
