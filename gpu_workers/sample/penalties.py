"""PenaltyCounts: each penalised request's token counts, kept on the device across steps.

Repetition penalties read which tokens the prompt or the output holds; frequency and presence
penalties read how often each token is in the output. Rebuilding those (P, V) counts from
every request's whole history each step costs a host list of all their tokens and its copy
(64 requests of 4k tokens: 256k ids a step; review C4). Here each request has a slot, a row
of two (S, V) tensors, and a step adds only the tokens its history gained since the last
(one sampled token per decode). The result equals a from-scratch count of the history.

Counting is two-phase so that a step stages all its host data in one copy: plan() reads the
histories on the host and adds the new tokens to the step's arrays; update() applies them on
the device from the staged tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch


class TokenHistory(Protocol):
    """What the sampler reads of a request's tokens (the runner's RequestState is one)."""

    @property
    def token_ids(self) -> list[int]: ...  # prompt, then every sampled token

    @property
    def num_prompt_tokens(self) -> int: ...


class PenaltyCounts:
    def __init__(self) -> None:
        self.slots: dict[str, int] = {}
        self._counted: dict[str, int] = {}  # how many of the request's tokens its slot holds
        self._free: list[int] = []
        self._capacity = 0
        self.prompt_seen: torch.Tensor | None = None  # (S, V) bool: in the prompt
        self.output_counts: torch.Tensor | None = None  # (S, V) float: times in the output

    def __len__(self) -> int:
        return len(self.slots)

    def release(self, key: str) -> None:
        slot = self.slots.pop(key, None)
        if slot is not None:
            del self._counted[key]
            self._free.append(slot)

    def plan(self, keys: Sequence[str], histories: Sequence[TokenHistory]) -> dict[str, np.ndarray]:
        """The host arrays update() needs to bring these requests' slots up to date, and
        their slots ("slots", in the order of keys)."""
        slots: list[int] = []
        fresh: list[int] = []  # slots (re)assigned now: cleared before anything is added
        prompt_slot: list[int] = []
        prompt_token: list[int] = []
        output_slot: list[int] = []
        output_token: list[int] = []
        for key, history in zip(keys, histories):
            tokens = history.token_ids
            counted = self._counted.get(key, 0)
            slot = self.slots.get(key)
            if slot is None or counted > len(tokens):  # new, or a history that is not ours
                slot = slot if slot is not None else self._assign(key)
                fresh.append(slot)
                counted = 0
            # tokens[counted:] are new: those before num_prompt_tokens are prompt
            split = max(counted, min(history.num_prompt_tokens, len(tokens)))
            prompt_token += tokens[counted:split]
            prompt_slot += [slot] * (split - counted)
            output_token += tokens[split:]
            output_slot += [slot] * (len(tokens) - split)
            self._counted[key] = len(tokens)
            slots.append(slot)
        return {
            "slots": np.asarray(slots, dtype=np.int64),
            "fresh": np.asarray(fresh, dtype=np.int64),
            "prompt_slot": np.asarray(prompt_slot, dtype=np.int64),
            "prompt_token": np.asarray(prompt_token, dtype=np.int64),
            "output_slot": np.asarray(output_slot, dtype=np.int64),
            "output_token": np.asarray(output_token, dtype=np.int64),
        }

    def update(self, staged: dict[str, torch.Tensor], vocab_size: int, dtype: torch.dtype) -> None:
        """Add the planned tokens on the device (no sync)."""
        device = staged["slots"].device
        self._ensure(vocab_size, dtype, device)
        assert self.prompt_seen is not None and self.output_counts is not None
        fresh = staged["fresh"]
        if fresh.numel():
            self.prompt_seen[fresh] = False
            self.output_counts[fresh] = 0
        if staged["prompt_slot"].numel():
            self.prompt_seen[staged["prompt_slot"], staged["prompt_token"]] = True
        s, t = staged["output_slot"], staged["output_token"]
        if s.numel():
            self.output_counts.index_put_((s, t), torch.ones_like(t, dtype=dtype), accumulate=True)

    def rows(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(seen in prompt or output (P, V) bool, output counts (P, V)) for these slots."""
        assert self.prompt_seen is not None and self.output_counts is not None
        counts = self.output_counts[slots]
        return self.prompt_seen[slots] | (counts > 0), counts

    def _assign(self, key: str) -> int:
        slot = self._free.pop() if self._free else len(self.slots) + len(self._free)
        self.slots[key] = slot
        return slot

    def _ensure(self, vocab_size: int, dtype: torch.dtype, device: torch.device) -> None:
        """Room for every assigned slot; grows by doubling, keeping what is counted. The capacity
        is a power of two from 8, so n requests never take more than the first that holds them
        (llm/step_memory.py's bound)."""
        needed = max(self.slots.values(), default=-1) + 1
        counts = self.output_counts
        if counts is not None and needed <= self._capacity and counts.dtype == dtype:
            return
        capacity = max(self._capacity, 8)
        while capacity < needed:
            capacity *= 2
        seen = torch.zeros(capacity, vocab_size, dtype=torch.bool, device=device)
        grown = torch.zeros(capacity, vocab_size, dtype=dtype, device=device)
        if counts is not None and self.prompt_seen is not None:
            seen[: self._capacity] = self.prompt_seen
            grown[: self._capacity] = counts.to(dtype)
        self.prompt_seen, self.output_counts, self._capacity = seen, grown, capacity
