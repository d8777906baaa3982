"""The worker applies a Step's grammar masks to exactly the rows they belong to."""

from __future__ import annotations

import numpy as np
import torch

from gpu_workers.token_masks import apply_token_masks


def mask_of(allowed: list[int], vocab: int) -> bytes:
    bits = np.zeros(-(-vocab // 32) * 32, dtype=np.uint8)
    bits[allowed] = 1
    return np.packbits(bits, bitorder="little").tobytes()


def test_only_allowed_tokens_keep_their_logits() -> None:
    logits = torch.randn(3, 70, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    apply_token_masks(logits, [mask_of([2, 33, 69], 70), None, mask_of([5], 70)])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [2, 33, 69]
    assert torch.equal(logits[0, [2, 33, 69]], before[0, [2, 33, 69]])
    assert torch.equal(logits[1], before[1])  # no mask: untouched
    assert logits[2].argmax().item() == 5  # greedy can only pick the allowed token


def test_rows_past_the_masks_end_are_never_allowed() -> None:
    # The model's embedding may be larger than the tokenizer the grammar was built for.
    logits = torch.zeros(1, 100)
    apply_token_masks(logits, [mask_of([0, 63], 64)])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0, 63]
