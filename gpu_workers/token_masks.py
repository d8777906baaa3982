"""Grammar masks: packed on the host as one (K, W) int32 bitmask, applied on the device at once.

A mask is the little-endian int32 words llguidance (and xgrammar) fill: bit t of the words is
set when token t is allowed; tokens past the mask's end are not. The K masked rows of a step
travel as one array inside the sampler's single staged copy, and one unpack with shifts and a
masked_fill applies them all, instead of a numpy unpack, a pageable copy and a masked_fill per
row (review C4).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def pack_masks(masks: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """(rows, words): the index of every row that has a mask, and their masks as (K, W) int32,
    W the longest mask's length (a shorter one is padded with zeros: nothing past its end)."""
    rows = [i for i, m in enumerate(masks) if m is not None]
    width = max((len(m) // 4 for m in masks if m is not None), default=0)
    words = np.zeros((len(rows), width), dtype=np.int32)
    for j, i in enumerate(rows):
        mask = masks[i]
        assert mask is not None
        if len(mask) % 4:
            raise ValueError(f"a token mask is whole int32 words, got {len(mask)} bytes")
        row = np.frombuffer(mask, dtype="<i4")
        words[j, : row.size] = row
    return np.asarray(rows, dtype=np.int64), words


def allowed_from_bitmask(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(K, W) int32 words -> (K, vocab_size) bool: token t allowed when bit t is set."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = (words[:, :, None] >> shifts) & 1  # (K, W, 32); an arithmetic shift keeps bit t right
    allowed = bits.reshape(words.shape[0], -1) != 0  # (K, 32 W)
    if allowed.shape[1] >= vocab_size:
        return allowed[:, :vocab_size]
    pad = torch.zeros(words.shape[0], vocab_size - allowed.shape[1], dtype=torch.bool, device=words.device)
    return torch.cat([allowed, pad], dim=1)


def apply_bitmask(logits: torch.Tensor, rows: torch.Tensor, words: torch.Tensor) -> None:
    """In place: each row in `rows` keeps only the logits its mask allows. Applied before
    sampling (and before logprobs are read), so greedy and sampled decoding both obey it."""
    if rows.numel() == 0:
        return
    allowed = allowed_from_bitmask(words, logits.shape[1])
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


def apply_token_masks(logits: torch.Tensor, masks: Sequence[bytes | None]) -> None:
    """apply_bitmask from the masks' bytes (None: that row is not constrained), in one copy."""
    rows, words = pack_masks(masks)
    if rows.size:
        apply_bitmask(
            logits, torch.from_numpy(rows).to(logits.device), torch.from_numpy(words).to(logits.device)
        )
