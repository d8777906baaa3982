"""The waiting queue's bounds: add_request refuses newcomers beyond them, never preempted
requests, and the waiting-token count stays exact through every way a request leaves."""

from __future__ import annotations

import pytest

from scheduler.block_manager import BlockManager
from scheduler.request import Request, RequestId, SamplingParams
from scheduler.scheduler import QueueFull, Scheduler, SchedulerConfig


def make_scheduler(
    *,
    max_num_waiting: int | None = None,
    max_num_waiting_tokens: int | None = None,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 64,
    num_blocks: int = 16,
    max_model_len: int = 64,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        max_num_waiting=max_num_waiting,
        max_num_waiting_tokens=max_num_waiting_tokens,
    )
    return Scheduler(config, BlockManager(num_blocks, 4))


def make_request(request_id: str, num_prompt_tokens: int, first_token: int = 1) -> Request:
    """Prompts with different first tokens share no cached block."""
    prompt = list(range(first_token, first_token + num_prompt_tokens))
    return Request(RequestId(request_id), prompt, SamplingParams(max_tokens=8))


def test_requests_beyond_the_bound_are_refused_until_one_leaves() -> None:
    s = make_scheduler(max_num_waiting=2)
    s.add_request(make_request("a", 5))
    s.add_request(make_request("b", 5))
    with pytest.raises(QueueFull) as refused:
        s.add_request(make_request("c", 5))
    assert refused.value.bound == "requests"
    assert s.num_waiting == 2 and s.get_request(RequestId("c")) is None  # nothing of it stayed
    s.abort_request(RequestId("a"))
    s.add_request(make_request("c", 5))
    assert s.num_waiting == 2
    s.check_invariants()


def test_tokens_beyond_the_bound_are_refused_but_an_empty_queue_takes_any_prompt() -> None:
    s = make_scheduler(max_num_waiting_tokens=10)
    s.add_request(make_request("long", 30))  # over the bound alone: the queue was empty
    with pytest.raises(QueueFull) as refused:
        s.add_request(make_request("b", 1))
    assert refused.value.bound == "tokens"
    assert s.num_waiting_tokens == 30
    s.check_invariants()


def test_a_request_that_starts_running_leaves_room() -> None:
    s = make_scheduler(max_num_waiting=1, max_num_waiting_tokens=8)
    s.add_request(make_request("a", 8))
    with pytest.raises(QueueFull):
        s.add_request(make_request("b", 8))
    output = s.schedule()
    assert [n.request.request_id for n in output.scheduled_new] == ["a"]
    assert (s.num_waiting, s.num_waiting_tokens) == (0, 0)
    s.add_request(make_request("b", 8))
    assert (s.num_waiting, s.num_waiting_tokens) == (1, 8)
    s.check_invariants()


def test_preempted_requests_rejoin_a_full_queue_and_count_their_output() -> None:
    # 4 blocks of 4 slots: two requests of 7 prompt tokens fill them, and their 9th tokens
    # need a third block each, so the later one is preempted.
    s = make_scheduler(max_num_waiting=2, num_blocks=4, max_num_batched_tokens=16, max_model_len=16)
    a, b = make_request("a", 7), make_request("b", 7, first_token=100)
    s.add_request(a)
    s.add_request(b)
    output = s.schedule()
    assert len(output.scheduled_new) == 2
    s.update_from_output(output, {a.request_id: 1, b.request_id: 1})
    s.add_request(make_request("c", 3, first_token=200))  # the queue is empty again: two
    s.add_request(make_request("d", 3, first_token=300))  # newcomers fill it
    output = s.schedule()  # a and b decode their 8th token; c and d find no free block
    s.update_from_output(output, {a.request_id: 1, b.request_id: 1})
    output = s.schedule()
    assert output.preempted_request_ids == [b.request_id]
    assert s.num_waiting == 3  # over the bound, which only newcomers meet
    assert s.num_waiting_tokens == 9 + 3 + 3  # b recomputes its prompt and its two outputs
    with pytest.raises(QueueFull):
        s.add_request(make_request("e", 1))
    s.check_invariants()


def test_the_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        make_scheduler(max_num_waiting=0)
    with pytest.raises(ValueError):
        make_scheduler(max_num_waiting_tokens=-1)
