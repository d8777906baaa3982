"""FakeLLMWorker: an LLM worker with no process and no model, behind the interface the engine
holds (WorkerProcess: start, send, recv, is_alive, kill, stop, label, exitcode).

It keeps each request's tokens as the runner does (the Step's new requests in full, the cached
ones as deltas, a resumed one's table anew) and samples exactly where the runner would: when a
request's scheduled chunk ends at its last known token. What it samples is a pure function of
the tokens so far, `next_token` (by default the last token plus one), so a test knows every
token id in advance. Every message crosses protocol.encode/decode, as on the pipe.

Its failures are scripted: `die_on_step` (the process exits once that step is sent, before it
answers), `error_on_step` (it answers with a WorkerError), `fail` (a request dropped before its
forward, a FailedRequest) and `gate` (it answers only once the test opens it, so the test acts
while a step is in flight; with one_step_a_gate, one step per opening).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omni.engines.worker_process import WorkerDied
from omni.shared import protocol


def next_after_last(tokens: list[int]) -> int:
    return tokens[-1] + 1


@dataclass
class _Held:
    tokens: list[int]
    sampling: protocol.SamplingOptions


@dataclass
class FakeLLMWorker:
    spec: protocol.LLMWorkerSpec
    on_exit: Callable[[], None]
    num_kv_blocks: int = 16
    block_size: int = 4
    max_model_len: int = 64
    next_token: Callable[[list[int]], int] = next_after_last
    die_on_step: set[int] = field(default_factory=set)  # step ids
    error_on_step: set[int] = field(default_factory=set)
    fail: dict[str, str] = field(default_factory=dict)  # request id -> the reason, in its next step
    gate: asyncio.Event | None = None  # set: steps are answered; clear: held until set
    one_step_a_gate: bool = False  # the gate closes again behind each step it lets through
    sent: list[Any] = field(default_factory=list)  # every message the engine sent, decoded
    starts: int = 0
    held: dict[str, _Held] = field(default_factory=dict)  # the requests the worker holds
    _inbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    _alive: bool = False
    _awaiting_masks: protocol.Step | None = None
    _step_seen: asyncio.Event = field(default_factory=asyncio.Event)

    # ---- WorkerProcess's interface ----------------------------------------------------
    @property
    def label(self) -> str:
        return f"{self.spec.LABEL} {self.spec.worker_id}"

    @property
    def is_alive(self) -> bool:
        return self._alive

    @property
    def exitcode(self) -> int | None:
        return None if self._alive else 1

    async def start(self, timeout: float) -> protocol.LLMReady:
        self.starts += 1
        self._alive = True
        self._inbox = asyncio.Queue()
        self.held = {}  # a new process: the KV cache and every request are gone
        return protocol.LLMReady(
            self.spec.worker_id, "cpu", self.num_kv_blocks, self.block_size, self.max_model_len
        )

    async def send(self, message: Any) -> None:
        if not self._alive:
            raise WorkerDied(f"{self.label} is not running")
        message = protocol.decode(protocol.encode(message))  # as it crosses the pipe
        self.sent.append(message)
        if isinstance(message, protocol.Step):
            self._step_seen.set()
            if message.step_id in self.die_on_step:
                self.die()
                return
            if message.masks_follow:
                self._awaiting_masks = message
                return
            self._inbox.put_nowait(message)
        elif isinstance(message, protocol.StepMasks):
            step, self._awaiting_masks = self._awaiting_masks, None
            assert step is not None and step.step_id == message.step_id, "masks for another step"
            self._inbox.put_nowait(step)

    async def recv(self) -> Any:
        step = await self._inbox.get()
        if step is None:
            self._inbox.put_nowait(None)
            raise WorkerDied(f"{self.label} exited (code 1)")
        if self.gate is not None:
            await self.gate.wait()
            if self.one_step_a_gate:
                self.gate.clear()
        reply = self.answer(step)
        return protocol.decode(protocol.encode(reply))

    async def kill(self) -> None:
        self.die()

    async def stop(self, timeout: float = 10.0) -> None:
        self.die()

    # ---- the fake ---------------------------------------------------------------------
    def die(self) -> None:
        """The process exits: every receive raises WorkerDied, and the engine is woken."""
        if not self._alive:
            return
        self._alive = False
        self._inbox.put_nowait(None)
        self.on_exit()

    async def wait_for_steps(self, n: int) -> None:
        """Return once the engine has sent its n-th Step (woken by each send, no polling)."""
        while len(self.steps) < n:
            self._step_seen.clear()
            await self._step_seen.wait()

    @property
    def steps(self) -> list[protocol.Step]:
        return [m for m in self.sent if isinstance(m, protocol.Step)]

    def answer(self, step: protocol.Step) -> protocol.StepResult | protocol.WorkerError:
        if step.step_id in self.error_on_step:
            return protocol.WorkerError("out of memory", job_id=step.step_id)
        for request_id in step.finished_request_ids:
            self.held.pop(request_id, None)
        failed = [protocol.FailedRequest(r, self.fail.pop(r)) for r in self._scheduled(step) if r in self.fail]
        failed_ids = {f.request_id for f in failed}
        sampled = []
        chunks = [(n.request_id, n.num_computed_tokens, n.num_scheduled_tokens) for n in step.new_requests]
        chunks += [(c.request_id, c.num_computed_tokens, c.num_scheduled_tokens) for c in step.cached_requests]
        for new in step.new_requests:
            self.held[new.request_id] = _Held(list(new.token_ids), new.sampling)
        for request_id, computed, num in chunks:
            if request_id in failed_ids:
                self.held.pop(request_id, None)
                continue
            held = self.held[request_id]  # a KeyError here is a step the runner would refuse
            if computed + num != len(held.tokens) or held.sampling.prefill_only:
                continue
            token = self.next_token(held.tokens)
            held.tokens.append(token)
            logprob = None if held.sampling.logprobs is None else -0.25
            top = None
            if held.sampling.logprobs:
                top = [protocol.TopLogprob(token + k, -0.25 * (k + 1)) for k in range(held.sampling.logprobs)]
            sampled.append(protocol.SampledToken(request_id, token, logprob, top))
        return protocol.StepResult(step.step_id, sampled, failed)

    @staticmethod
    def _scheduled(step: protocol.Step) -> list[str]:
        return [n.request_id for n in step.new_requests] + [c.request_id for c in step.cached_requests]
