"""The worker applies a Step's grammar masks to exactly the rows they belong to, as one packed bitmask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_workers.sample.token_masks import StepMaskReader, apply_bitmask, apply_token_masks, pack_masks, row_masks
from omni.shared import protocol
from omni.text.constrained.constraint import allowed_tokens


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


def per_row_reference(logits: torch.Tensor, masks: list[bytes | None]) -> None:
    """The runner's masking before the change: numpy unpack, a copy and a masked_fill per row."""
    vocab = logits.shape[1]
    for row, mask in enumerate(masks):
        if mask is None:
            continue
        bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), bitorder="little")
        allowed = np.zeros(vocab, dtype=bool)
        n = min(vocab, bits.size)
        allowed[:n] = bits[:n].astype(bool)
        logits[row].masked_fill_(torch.from_numpy(~allowed), float("-inf"))


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]
)
def test_the_packed_bitmask_allows_what_the_per_row_masks_allowed(device: str) -> None:
    """64 random masks (bit 31 set in many words: the sign bit of an int32), some rows without
    one, masks shorter and longer than the vocabulary: the same logits, exactly."""
    rng = np.random.default_rng(0)
    for vocab, mask_vocab in [(1000, 1000), (1000, 960), (1000, 1056), (70, 70)]:
        masks: list[bytes | None] = []
        for i in range(64):
            if i % 5 == 3:
                masks.append(None)
                continue
            allowed = np.flatnonzero(rng.random(mask_vocab) < 0.3).tolist() or [0]
            masks.append(mask_of(allowed, mask_vocab))
        x = torch.randn(64, vocab, generator=torch.Generator().manual_seed(vocab))
        want = x.clone()
        per_row_reference(want, masks)
        rows, words = pack_masks(masks)
        got = x.to(device)
        apply_bitmask(got, torch.from_numpy(rows).to(device), torch.from_numpy(words).to(device))
        assert torch.equal(got.cpu(), want)


def test_a_request_verifying_drafts_gets_a_mask_per_row() -> None:
    """A TokenMask of several rows is split per row, and each of the request's consecutive
    sampled rows takes its own; other rows take none."""
    step = protocol.Step(1, [], [], [], [protocol.TokenMask("a", mask_of([1], 64) + mask_of([2], 64) + mask_of([3], 64), 3),
                                         protocol.TokenMask("b", mask_of([4], 64))])  # fmt: skip
    masks = StepMaskReader(step, None).masks()
    assert [len(masks["a"]), len(masks["b"])] == [3, 1]
    rows = row_masks(["c", "a", "a", "a", "b"], masks)
    assert rows is not None and rows[0] is None
    assert [allowed_tokens(m, 64).tolist() for m in rows[1:] if m is not None] == [[1], [2], [3], [4]]
    assert row_masks(["a"], {}) is None
    with pytest.raises(ValueError, match="not 3 masks"):
        StepMaskReader(protocol.Step(2, [], [], [], [protocol.TokenMask("a", b"\0" * 10, 3)]), None)
