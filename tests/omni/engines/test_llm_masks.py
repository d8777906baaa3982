"""Grammar masks overlap the step (review C5): the engine sends a constrained step's Step first,
fills its masks while the worker runs the forward, and sends them after it (StepMasks); the
runner reads them just before it samples.

The engine here is the real LLMEngine and its scheduler; the worker is the real LLMRunner on a
tiny checkpoint, served by the worker's own loop (gpu_workers.worker._serve) on a thread, over
a multiprocessing pipe, so the messages cross the wire as they do between processes. The
grammars are scripted: each step allows exactly one token (a random one), so a token sampled
at temperature 1 shows which mask reached which request's row in which step.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import threading
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import pytest

from gpu_workers import worker
from gpu_workers.llm.runner import LLMRunner
from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from omni.config import AdmissionConfig, LLMConfig
from omni.engines.llm import EngineError, LLMEngine, TokenEvent
from omni.metrics import Metrics
from omni.shared import protocol
from omni.text.constrained.constraint import TokenConstraint, single_token_mask
from scheduler.request import Request, RequestId, SamplingParams

BLOCK_SIZE = 4
NUM_KV_BLOCKS = 64
WAIT_S = 120.0  # a hang guard: a fill whose forward never begins fails the test, late


class ScriptedGrammar:
    """The part of TokenConstraint the engine uses: each step allows exactly script[i]."""

    forced_token_id = None
    violated = False
    cut_short = False

    def __init__(self, script: list[int], vocab_size: int) -> None:
        self.script = script
        self.vocab_size = vocab_size
        self.seen: list[int] = []

    @property
    def active(self) -> bool:
        return len(self.seen) < len(self.script)

    @property
    def complete(self) -> bool:
        return not self.active

    def mask(self) -> bytes:
        return single_token_mask(self.script[len(self.seen)], self.vocab_size)

    def advance(self, token_id: int) -> None:
        self.seen.append(token_id)


class Forwards:
    """How many forwards the runner has begun; a wait for the n-th."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    def begin(self) -> None:
        with self._changed:
            self.count += 1
            self._changed.notify_all()

    def wait_for(self, n: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.count >= n, WAIT_S)


class HeldFiller:
    """A mask filler whose k-th fill returns only once the worker has begun its k-th forward
    (or after WAIT_S): were the masks filled before the Step went out, the k-th forward could
    not begin before the k-th fill returned. Every step of the test has a fill."""

    def __init__(self, forwards: Forwards) -> None:
        self.forwards = forwards
        self.base = forwards.count  # forwards before this filler's first step
        self.fills = 0
        self.forward_first = 0  # fills that saw their step's forward begin

    async def fill(self, constraints: Sequence[TokenConstraint]) -> list[bytes]:
        self.fills += 1
        if await asyncio.to_thread(self.forwards.wait_for, self.base + self.fills):
            self.forward_first += 1
        return [cast(ScriptedGrammar, c).mask() for c in constraints]


class FailingFiller:
    async def fill(self, constraints: Sequence[TokenConstraint]) -> list[bytes]:
        raise RuntimeError("the grammar engine failed")


class PipeWorker:
    """The engine's end of the pipe, in place of WorkerProcess."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.sent: list[Any] = []

    async def send(self, message: Any) -> None:
        self.sent.append(message)
        self.conn.send_bytes(protocol.encode(message))

    async def recv(self) -> Any:
        return protocol.decode(await asyncio.to_thread(self.conn.recv_bytes))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "hyperclovax")


@pytest.fixture
def served(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LLMEngine, PipeWorker, Forwards, int]]:
    """An engine whose worker is a real runner served on a thread, the runner's forwards
    counted as they begin, and the model's vocabulary size."""
    runner = LLMRunner(tiny, block_size=BLOCK_SIZE, num_kv_blocks=NUM_KV_BLOCKS)
    forwards = Forwards()
    forward = runner.model.forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        forwards.begin()
        return forward(*args, **kwargs)

    monkeypatch.setattr(runner.model, "forward", counted)
    server_end, worker_end = multiprocessing.Pipe()
    serving = threading.Thread(target=worker._serve, args=(worker_end, runner), daemon=True)
    serving.start()
    monkeypatch.setattr(LLMEngine, "ready", property(lambda self: self.scheduler is not None))
    spec = protocol.LLMWorkerSpec(worker_id=0, model_dir=str(tiny), block_size=BLOCK_SIZE)
    engine = LLMEngine(
        spec, LLMConfig(block_size=BLOCK_SIZE, max_num_seqs=4), AdmissionConfig(), Metrics(), model_name="m"
    )
    engine.on_ready(protocol.LLMReady(0, "cpu", NUM_KV_BLOCKS, BLOCK_SIZE, 256))
    pipe = PipeWorker(server_end)
    engine.worker = pipe  # type: ignore[assignment]
    yield engine, pipe, forwards, runner.model_config.vocab_size
    server_end.send_bytes(protocol.encode(protocol.Shutdown()))
    serving.join(WAIT_S)
    assert not serving.is_alive()


def submit(engine: LLMEngine, name: str, grammar: ScriptedGrammar | None, max_tokens: int) -> Any:
    request = Request(
        RequestId(name), [3, 1, 4, 1, 5, 9, 2][: 4 + len(name) % 3], SamplingParams(max_tokens=max_tokens)
    )
    return engine.submit(request, constraint=cast(TokenConstraint, grammar))


async def run_until_done(engine: LLMEngine) -> None:
    assert engine.scheduler is not None
    while engine.scheduler.has_unfinished_requests:
        await asyncio.wait_for(engine.run_once(), 2 * WAIT_S)


def tokens(stream: Any) -> list[int]:
    out = []
    while not stream.queue.empty():
        item = stream.queue.get_nowait()
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, TokenEvent)
        out.append(item.token_id)
    return out


async def test_the_forward_begins_before_the_masks_are_filled_and_sampling_obeys_them(
    served: tuple[LLMEngine, PipeWorker, Forwards, int],
) -> None:
    engine, pipe, forwards, vocab = served
    rng = random.Random(5)
    grammars = {
        name: ScriptedGrammar([rng.randrange(vocab) for _ in range(n)], vocab) for name, n in [("a", 6), ("bb", 4)]
    }
    filler = HeldFiller(forwards)
    engine._masks = filler  # type: ignore[assignment]
    streams = {name: submit(engine, name, g, max_tokens=20) for name, g in grammars.items()}
    free = submit(engine, "free", None, max_tokens=8)  # unconstrained, in the same batches
    await run_until_done(engine)
    for name, grammar in grammars.items():
        assert tokens(streams[name]) == grammar.script == grammar.seen
    assert len(tokens(free)) == 8
    # one fill a step with a constrained request sampling, each one after its forward began
    assert filler.fills == 6 and filler.forward_first == 6
    steps = [m for m in pipe.sent if isinstance(m, protocol.Step)]
    follow = [m for m in pipe.sent if isinstance(m, protocol.StepMasks)]
    assert all(s.masks_follow and not s.token_masks for s in steps[:6]) and not steps[-1].masks_follow
    assert [m.step_id for m in follow] == [s.step_id for s in steps[:6]]
    assert [sorted(t.request_id for t in m.token_masks) for m in follow] == [["a", "bb"]] * 4 + [["a"]] * 2


async def test_masks_that_cannot_be_filled_fail_their_step_and_the_worker_stays_in_step(
    served: tuple[LLMEngine, PipeWorker, Forwards, int],
) -> None:
    engine, _, forwards, vocab = served
    engine._masks = FailingFiller()  # type: ignore[assignment]
    doomed = submit(engine, "a", ScriptedGrammar([7, 8], vocab), max_tokens=5)
    await run_until_done(engine)
    with pytest.raises(EngineError, match="the grammar engine failed"):
        tokens(doomed)
    # the worker took the StepMasks off its pipe: the next step is answered as itself
    engine._masks = HeldFiller(forwards)  # type: ignore[assignment]
    fine = submit(engine, "b", ScriptedGrammar([9, 10, 11], vocab), max_tokens=5)
    await run_until_done(engine)
    assert tokens(fine) == [9, 10, 11]


def test_a_step_that_fails_before_sampling_still_reads_its_masks(tiny: Path) -> None:
    runner = LLMRunner(tiny, block_size=BLOCK_SIZE, num_kv_blocks=NUM_KV_BLOCKS)
    inbox = [protocol.StepMasks(1, [protocol.TokenMask("x", single_token_mask(3, 1472))])]
    runner.receive = inbox.pop
    bad = protocol.Step(1, [], [protocol.CachedRequest("unknown", [], 0, 1)], [], masks_follow=True)
    with pytest.raises(ValueError, match="unknown"):
        runner.execute(bad)
    assert not inbox  # read, so it is not taken for the next job
    # and a StepMasks of another step is refused rather than applied
    runner.receive = [protocol.StepMasks(7, [])].pop
    greedy = protocol.SamplingOptions(temperature=0.0)
    step = protocol.Step(2, [protocol.NewRequest("r", [1, 2, 3], greedy, [0], 0, 3)], [], [], masks_follow=True)
    with pytest.raises(ValueError, match="StepMasks was expected"):
        runner.execute(step)
