"""--scheduling-policy priority: (priority, arrival) order, lower first; the least urgent running
request preempted for a more urgent waiting one; a full queue shedding for a more urgent newcomer."""

from __future__ import annotations

import pytest

from scheduler.block_manager import BlockManager
from scheduler.request import Request, RequestId, RequestStatus, SamplingParams
from scheduler.scheduler import QueueFull, Scheduler, SchedulerConfig
from scheduler.waiting_queue import FcfsQueue, PriorityQueue

EOS = 0


def make_scheduler(
    policy: str = "priority",
    *,
    max_num_seqs: int = 4,
    num_blocks: int = 16,
    max_num_waiting: int | None = None,
    max_num_batched_tokens: int = 64,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=32,
        max_num_waiting=max_num_waiting,
        policy=policy,  # type: ignore[arg-type]
    )
    return Scheduler(config, BlockManager(num_blocks, 4))


def make_request(request_id: str, priority: int, arrival: float, prompt_len: int = 4, max_tokens: int = 8) -> Request:
    first = 1 + 100 * int(arrival)  # prompts differ: no request finds another's blocks cached
    return Request(
        RequestId(request_id),
        list(range(first, first + prompt_len)),
        SamplingParams(max_tokens=max_tokens, priority=priority),
        eos_token_ids=frozenset({EOS}),
        arrival_time=arrival,
    )


def scheduled_ids(output) -> list[str]:
    return [s.request.request_id for s in output.scheduled_new] + [c.request_id for c in output.scheduled_cached]


def run_step(s: Scheduler, token: int = 7):
    output = s.schedule()
    ids = scheduled_ids(output)
    s.update_from_output(output, {RequestId(i): token for i in ids})
    s.check_invariants()
    return output


def test_priority_queue_orders_by_priority_then_arrival() -> None:
    q = PriorityQueue()
    for rid, prio, t in [("a", 1, 0.0), ("b", 0, 2.0), ("c", 1, 1.0), ("d", -3, 5.0), ("e", 0, 2.0)]:
        q.add(make_request(rid, prio, t))
    assert [r.request_id for r in q] == ["d", "b", "e", "a", "c"]  # b and e tie: insertion order
    assert q.pop().request_id == "d"


def test_fcfs_queue_ignores_priority_and_puts_preempted_first() -> None:
    q = FcfsQueue()
    q.add(make_request("a", 5, 0.0))
    q.add(make_request("b", -5, 1.0))
    q.add_preempted(make_request("c", 9, 2.0))
    assert [r.request_id for r in q] == ["c", "a", "b"]


def test_the_most_urgent_waiting_request_is_scheduled_first() -> None:
    s = make_scheduler(max_num_seqs=2)
    for rid, prio, t in [("late", 2, 0.0), ("urgent", 0, 3.0), ("mid", 1, 1.0), ("mid2", 1, 2.0)]:
        s.add_request(make_request(rid, prio, t))
    assert scheduled_ids(run_step(s)) == ["urgent", "mid"]


def test_fcfs_schedules_in_arrival_order_whatever_the_priority() -> None:
    s = make_scheduler("fcfs", max_num_seqs=2)
    for rid, prio, t in [("late", 2, 0.0), ("urgent", 0, 3.0), ("mid", 1, 1.0)]:
        s.add_request(make_request(rid, prio, t))
    output = run_step(s)
    assert scheduled_ids(output) == ["late", "urgent"]
    assert output.preempted_request_ids == []


def test_a_full_batch_preempts_its_least_urgent_request_for_a_more_urgent_one() -> None:
    s = make_scheduler(max_num_seqs=2)
    s.add_request(make_request("a", 1, 0.0))
    s.add_request(make_request("b", 1, 1.0))
    run_step(s)  # both prefilled, one token each
    s.add_request(make_request("urgent", 0, 2.0))
    output = run_step(s)
    assert output.preempted_request_ids == ["b"]  # equal priority: the later arrival goes
    assert scheduled_ids(output) == ["urgent", "a"]
    b = s.get_request(RequestId("b"))
    assert b is not None and b.status is RequestStatus.PREEMPTED and b.output_token_ids == [7]
    assert s.num_preemptions_total == 1
    assert s.num_preemptions_by_reason == {"kv_cache": 0, "priority": 1}


def test_a_less_urgent_waiting_request_preempts_nothing() -> None:
    s = make_scheduler(max_num_seqs=2)
    s.add_request(make_request("a", 1, 0.0))
    s.add_request(make_request("b", 1, 1.0))
    run_step(s)
    s.add_request(make_request("equal", 1, 1.5))  # same priority, later arrival: less urgent
    s.add_request(make_request("lazy", 5, 2.0))
    output = run_step(s)
    assert output.preempted_request_ids == []
    assert scheduled_ids(output) == ["a", "b"]


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_the_token_budget_serves_an_urgent_prefill_before_a_less_urgent_prompts_chunks(policy: str) -> None:
    s = make_scheduler(policy, max_num_batched_tokens=8)
    s.add_request(make_request("long", 1, 0.0, prompt_len=24))
    output = run_step(s)
    assert [(n.request.request_id, n.num_scheduled_tokens) for n in output.scheduled_new] == [("long", 8)]
    s.add_request(make_request("urgent", 0, 1.0, prompt_len=6))
    output = run_step(s)
    chunks = {n.request.request_id: n.num_scheduled_tokens for n in output.scheduled_new}
    chunks |= {c.request_id: c.num_scheduled_tokens for c in output.scheduled_cached}
    if policy == "priority":  # the urgent prompt whole, the long one's chunk with what is left
        assert chunks == {"urgent": 6, "long": 2}
    else:  # arrival order: the long prompt's chunk takes the budget
        assert chunks == {"long": 8}
    assert output.preempted_request_ids == []


def test_the_budget_keeps_more_urgent_running_requests_first() -> None:
    s = make_scheduler(max_num_batched_tokens=8)
    s.add_request(make_request("first", 0, 0.0, prompt_len=20))
    run_step(s)  # 8 of its 20 prompt tokens
    s.add_request(make_request("later", 1, 1.0, prompt_len=4))
    output = run_step(s)
    assert [(c.request_id, c.num_scheduled_tokens) for c in output.scheduled_cached] == [("first", 8)]
    assert output.scheduled_new == []


def test_a_full_kv_cache_preempts_the_least_urgent_and_its_tokens_are_recomputed_and_kept() -> None:
    # 8 blocks of 4 = 32 slots. Two 12-token prompts fill 6 blocks (+1 each for their outputs
    # soon); an urgent 12-token prompt needs 3 (its first step) with at most 2 free.
    s = make_scheduler(max_num_seqs=4, num_blocks=8)
    s.add_request(make_request("a", 1, 0.0, prompt_len=12, max_tokens=6))
    s.add_request(make_request("b", 2, 1.0, prompt_len=12, max_tokens=6))
    run_step(s, token=5)
    run_step(s, token=6)
    b = s.get_request(RequestId("b"))
    assert b is not None and b.output_token_ids == [5, 6]
    s.add_request(make_request("urgent", 0, 2.0, prompt_len=12, max_tokens=6))
    output = run_step(s, token=8)
    assert output.preempted_request_ids == ["b"]
    assert "urgent" in scheduled_ids(output) and "b" not in scheduled_ids(output)
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.output_token_ids == [5, 6]  # its output is kept: recomputed, never lost
    # run to the end: b resumes (its prompt and both outputs recomputed) and finishes whole
    resumed_at = None
    for step_no in range(20):
        out = run_step(s, token=9)
        resumed = [c for c in out.scheduled_cached if c.request_id == "b" and c.resumed]
        if resumed and resumed_at is None:
            resumed_at = step_no
            assert resumed[0].num_computed_tokens + resumed[0].num_scheduled_tokens == 14  # 12 + 2 outputs
        if not s.has_unfinished_requests:
            break
    assert resumed_at is not None
    assert b.status is RequestStatus.FINISHED_LENGTH
    assert b.output_token_ids[:2] == [5, 6] and len(b.output_token_ids) == 6


def test_under_fcfs_a_full_batch_preempts_nothing() -> None:
    s = make_scheduler("fcfs", max_num_seqs=2)
    s.add_request(make_request("a", 1, 0.0))
    s.add_request(make_request("b", 1, 1.0))
    run_step(s)
    s.add_request(make_request("urgent", -10, 2.0))
    output = run_step(s)
    assert output.preempted_request_ids == []
    assert scheduled_ids(output) == ["a", "b"]


def test_a_full_queue_sheds_its_least_urgent_waiting_request_for_a_more_urgent_one() -> None:
    s = make_scheduler(max_num_seqs=1, max_num_waiting=2)
    s.add_request(make_request("running", 3, 0.0))
    run_step(s)
    s.add_request(make_request("w1", 2, 1.0))
    s.add_request(make_request("w2", 2, 2.0))
    shed = s.add_request(make_request("urgent", 0, 3.0))
    assert [r.request_id for r in shed] == ["w2"]  # equal priority: the later arrival
    assert shed[0].status is RequestStatus.FINISHED_ABORTED
    assert s.get_request(RequestId("w2")) is None
    assert s.num_waiting == 2
    s.check_invariants()
    with pytest.raises(QueueFull):  # no waiting one is less urgent than this one
        s.add_request(make_request("also", 2, 4.0))
    assert s.num_waiting == 2


def test_a_full_queue_never_sheds_a_preempted_request() -> None:
    s = make_scheduler(max_num_seqs=1, max_num_waiting=1)
    s.add_request(make_request("low", 5, 0.0))
    run_step(s)
    s.add_request(make_request("mid", 1, 1.0))
    run_step(s)  # mid preempts low, which waits with its output
    low = s.get_request(RequestId("low"))
    assert low is not None and low.status is RequestStatus.PREEMPTED
    with pytest.raises(QueueFull):
        s.add_request(make_request("urgent", 0, 2.0))


def test_under_fcfs_a_full_queue_refuses_the_newcomer() -> None:
    s = make_scheduler("fcfs", max_num_seqs=1, max_num_waiting=1)
    s.add_request(make_request("running", 3, 0.0))
    run_step(s)
    s.add_request(make_request("w1", 5, 1.0))
    with pytest.raises(QueueFull):
        s.add_request(make_request("urgent", 0, 2.0))


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="scheduling policy"):
        SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=8, max_model_len=8, policy="lifo")  # type: ignore[arg-type]
