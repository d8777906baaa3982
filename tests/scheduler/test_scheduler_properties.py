"""Random admit / step / abort sequences against a fake worker that simulates KV content, under
either scheduling policy (requests of mixed priorities).

The fake worker follows the Step protocol (new requests in full, deltas, resumed tables,
finished ids) and stores in each KV slot the token prefix that produced it. Every step
first writes the scheduled positions of all requests, then checks that each request reads
exactly its own prefix at positions [0, num_computed + num_scheduled): a wrong prefix hit,
a block shared while being written, or a table the worker and scheduler disagree on fails.
"""

from __future__ import annotations

import random

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from scheduler.block_manager import BlockManager
from scheduler.output import SchedulerOutput
from scheduler.request import Request, RequestId, SamplingParams
from scheduler.scheduler import Scheduler, SchedulerConfig
from scheduler.waiting_queue import SchedulingPolicy

EOS = 0
PREFIXES = ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9], [5, 5, 5, 5, 5, 5, 5])
MAX_MODEL_LEN = 16


class FakeWorker:
    def __init__(self, block_size: int, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.tokens: dict[RequestId, list[int]] = {}
        self.tables: dict[RequestId, list[int]] = {}
        self.kv: dict[tuple[int, int], tuple[int, ...]] = {}  # (block, slot) -> prefix

    def execute(self, output: SchedulerOutput, rng: random.Random) -> dict[RequestId, int]:
        for request_id in output.finished_request_ids:
            del self.tokens[request_id]  # KeyError: unknown or reported twice
            del self.tables[request_id]
        work: list[tuple[RequestId, int, int]] = []
        for new in output.scheduled_new:
            request_id = new.request.request_id
            assert request_id not in self.tokens
            self.tokens[request_id] = list(new.request.all_token_ids)
            self.tables[request_id] = list(new.block_ids)
            work.append((request_id, new.num_computed_tokens, new.num_scheduled_tokens))
        for cached in output.scheduled_cached:
            assert cached.request_id in self.tokens
            if cached.resumed:
                self.tables[cached.request_id] = list(cached.new_block_ids)
            else:
                self.tables[cached.request_id] += cached.new_block_ids
            work.append(
                (cached.request_id, cached.num_computed_tokens, cached.num_scheduled_tokens)
            )
        assert len(work) <= self.max_num_seqs
        assert output.total_num_scheduled_tokens <= self.max_num_batched_tokens
        bs = self.block_size
        for request_id, start, count in work:  # write all, as each layer does, then read
            assert count > 0 and start + count <= len(self.tokens[request_id])
            table, tokens = self.tables[request_id], self.tokens[request_id]
            for p in range(start, start + count):
                self.kv[table[p // bs], p % bs] = tuple(tokens[: p + 1])
        sampled: dict[RequestId, int] = {}
        for request_id, start, count in work:
            table, tokens = self.tables[request_id], self.tokens[request_id]
            for p in range(start + count):
                assert self.kv.get((table[p // bs], p % bs)) == tuple(tokens[: p + 1])
            if start + count == len(tokens):
                sampled[request_id] = rng.choice([EOS, 1, 2, 3, 4, 5, 6, 7])
                tokens.append(sampled[request_id])
        return sampled


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        block_size=st.sampled_from([2, 4]),
        spare_blocks=st.integers(0, 2),
        prefix_caching=st.booleans(),
        chunked=st.booleans(),
        policy=st.sampled_from(["fcfs", "priority"]),
    )
    def setup(
        self, block_size: int, spare_blocks: int, prefix_caching: bool, chunked: bool, policy: SchedulingPolicy
    ) -> None:
        # A pool barely above one max-length request: preemption is common.
        num_blocks = MAX_MODEL_LEN // block_size + spare_blocks
        budget = 5 if chunked else MAX_MODEL_LEN
        config = SchedulerConfig(3, budget, MAX_MODEL_LEN, chunked, policy=policy)
        self.scheduler = Scheduler(config, BlockManager(num_blocks, block_size, prefix_caching))
        self.worker = FakeWorker(block_size, 3, budget)
        self.next_id = 0
        self.history: list[Request] = []
        self.rng = random.Random(0)

    @rule(
        prefix=st.sampled_from(PREFIXES),
        cut=st.integers(2, 8),
        suffix=st.lists(st.integers(1, 5), max_size=3),
        max_tokens=st.integers(1, 8),
        priority=st.integers(-1, 1),
    )
    def add(self, prefix: list[int], cut: int, suffix: list[int], max_tokens: int, priority: int) -> None:
        self._add(prefix[:cut] + suffix, max_tokens, priority)

    @rule(pick=st.integers(0, 100), max_tokens=st.integers(1, 8), priority=st.integers(-1, 1))
    def add_next_turn(self, pick: int, max_tokens: int, priority: int) -> None:
        """A chat's next turn: an earlier request's prompt and output, and more."""
        if self.history:
            earlier = self.history[pick % len(self.history)]
            self._add((earlier.all_token_ids + [6])[: MAX_MODEL_LEN - 2], max_tokens, priority)

    def _add(self, prompt: list[int], max_tokens: int, priority: int) -> None:
        """priority: the priority policy's order (fcfs ignores it)."""
        request = Request(
            RequestId(f"r{self.next_id}"),
            prompt,
            SamplingParams(max_tokens=max_tokens, priority=priority),
            eos_token_ids=frozenset({EOS}),
        )
        self.next_id += 1
        self.history.append(request)
        self.scheduler.add_request(request)

    @rule(seed=st.integers(0, 2**16))
    def step(self, seed: int) -> None:
        self.rng.seed(seed)
        self._step()

    @rule(seed=st.integers(0, 2**16), pick=st.integers(0, 100))
    def step_with_abort_in_flight(self, seed: int, pick: int) -> None:
        """A client disconnects after the step was sent: the worker still runs it."""
        self.rng.seed(seed)
        output = self.scheduler.schedule()
        scheduled = [s.request.request_id for s in output.scheduled_new]
        scheduled += [s.request_id for s in output.scheduled_cached]
        if scheduled:
            self.scheduler.abort_request(scheduled[pick % len(scheduled)])
        self._update(output)

    @rule(pick=st.integers(0, 100))
    def abort(self, pick: int) -> None:
        ids = sorted(self.scheduler._requests)
        if ids:
            aborted = self.scheduler.abort_request(ids[pick % len(ids)])
            assert aborted is not None and aborted.is_finished

    def _step(self) -> None:
        self._update(self.scheduler.schedule())

    def _update(self, output: SchedulerOutput) -> None:
        sampled = self.worker.execute(output, self.rng)
        updated = self.scheduler.update_from_output(output, sampled)
        for request in updated:
            assert request.output_token_ids[-1] == sampled[request.request_id]
        for request_id, tokens in self.worker.tokens.items():
            request = self.scheduler.get_request(request_id)
            if request is not None:  # alive: both sides agree on every token
                assert request.all_token_ids == tokens

    @invariant()
    def invariants_hold(self) -> None:
        if hasattr(self, "scheduler"):
            self.scheduler.check_invariants()

    def teardown(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        # Liveness: everything finishes on its own; then nothing leaks anywhere.
        for _ in range(200):
            if not self.scheduler.has_unfinished_requests:
                break
            self._step()
            self.scheduler.check_invariants()
        assert not self.scheduler.has_unfinished_requests
        self._step()  # delivers the last finished ids
        assert self.worker.tokens == {}
        bm = self.scheduler.block_manager
        assert bm.num_free_blocks == bm.num_blocks and bm.usage == 0.0
        assert self.scheduler.num_running == self.scheduler.num_waiting == 0
        assert self.scheduler.prefix_cache_hit_tokens <= self.scheduler.prefix_cache_queried_tokens
        # Shown by --hypothesis-show-statistics: the runs do reach the interesting paths.
        event("preempted", self.scheduler.num_preemptions_total > 0)
        event("prefix hit", self.scheduler.prefix_cache_hit_tokens > 0)
        event("preempted for priority", self.scheduler.num_preemptions_by_reason["priority"] > 0)


SchedulerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None
)
TestSchedulerMachine = SchedulerMachine.TestCase
