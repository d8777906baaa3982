"""Grammar masks: packed on the host as one (K, W) int32 bitmask, applied on the device at once.

A mask is the little-endian int32 words llguidance (and xgrammar) fill: bit t of the words is
set when token t is allowed; tokens past the mask's end are not. The K masked rows of a step
travel as one array inside the sampler's single staged copy, and one unpack with shifts and a
masked_fill applies them all, instead of a numpy unpack, a pageable copy and a masked_fill per
row (review C4).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

from omni.shared import protocol

log = logging.getLogger(__name__)


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


def row_masks(sample_ids: Sequence[str], masks: dict[str, list[bytes]]) -> list[bytes | None] | None:
    """Per sampled row, its mask: a request's consecutive rows (speculative decoding's d + 1)
    take its masks in order; a row without one is not constrained. None: no row has a mask."""
    if not masks:
        return None
    out: list[bytes | None] = []
    previous, j = None, 0
    for request_id in sample_ids:
        j = j + 1 if request_id == previous else 0
        previous = request_id
        rows = masks.get(request_id)
        out.append(rows[j] if rows is not None and j < len(rows) else None)
    return out


class StepMaskReader:
    """A Step's grammar masks, by request id (a list: one per row it samples): those it carries,
    and with masks_follow those of the StepMasks the server sends after it, filled while this
    step's forward runs (review C5).
    That message is read once, when sampling first needs it, or by settle() when the step
    ends without sampling (it failed, or its constrained requests were dropped), so that it is
    never left on the pipe to be taken for the next job."""

    def __init__(self, step: protocol.Step, receive: Callable[[], object] | None) -> None:
        self.step = step
        self._receive = receive
        self._masks: dict[str, list[bytes]] | None = None if step.masks_follow else self._of(step.token_masks)

    def masks(self) -> dict[str, list[bytes]]:
        if self._masks is None:
            self._masks = self._read()
        return self._masks

    def settle(self) -> None:
        if self._masks is None:
            try:
                self.masks()
            except Exception as exc:  # noqa: BLE001 - the step's own outcome is what is reported
                log.error("step %d: its masks: %s", self.step.step_id, exc)

    def _read(self) -> dict[str, list[bytes]]:
        self._masks = {}  # read at most once, even when what comes is wrong
        if self._receive is None:
            raise RuntimeError(f"step {self.step.step_id}: its masks follow, but there is no pipe to read them from")
        follow = self._receive()
        if not isinstance(follow, protocol.StepMasks) or follow.step_id != self.step.step_id:
            got = f"{type(follow).__name__} {getattr(follow, 'step_id', '')}".strip()
            raise ValueError(f"step {self.step.step_id}: its StepMasks was expected, got {got}")
        if follow.error is not None:
            raise ValueError(f"step {self.step.step_id}: the server could not fill its grammar masks: {follow.error}")
        return self._of([*self.step.token_masks, *follow.token_masks])

    @staticmethod
    def _of(token_masks: Iterable[protocol.TokenMask]) -> dict[str, list[bytes]]:
        masks = {}
        for m in token_masks:
            if m.rows < 1 or len(m.bitmask) % m.rows:
                raise ValueError(f"request {m.request_id!r}: {len(m.bitmask)} bytes are not {m.rows} masks")
            width = len(m.bitmask) // m.rows
            masks[m.request_id] = [m.bitmask[j * width : (j + 1) * width] for j in range(m.rows)]
        return masks
