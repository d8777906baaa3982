"""SchedulerOutput: what a step computes, counted per request and in all, and when a step
carries nothing worth sending."""

from __future__ import annotations

from scheduler.block_manager import BlockId
from scheduler.output import ScheduledCachedRequest, ScheduledNewRequest, SchedulerOutput
from scheduler.request import Request, RequestId, SamplingParams


def output(new: list[ScheduledNewRequest], cached: list[ScheduledCachedRequest], finished: list[str] = ()) -> SchedulerOutput:  # type: ignore[assignment]
    return SchedulerOutput(1, new, cached, [RequestId(f) for f in finished], [])


def new(name: str, num: int) -> ScheduledNewRequest:
    request = Request(RequestId(name), list(range(num)), SamplingParams(max_tokens=1))
    return ScheduledNewRequest(request, [BlockId(0)], 0, num)


def cached(name: str, num: int) -> ScheduledCachedRequest:
    return ScheduledCachedRequest(RequestId(name), [], 10, num, resumed=False)


def test_tokens_are_counted_per_request_and_in_all() -> None:
    out = output([new("a", 7), new("b", 3)], [cached("c", 1), cached("d", 2)])
    assert out.total_num_scheduled_tokens == 13
    assert [out.num_scheduled_tokens(RequestId(r)) for r in "abcde"] == [7, 3, 1, 2, 0]


def test_a_step_is_empty_only_with_nothing_to_compute_and_nothing_to_drop() -> None:
    assert output([], []).is_empty
    assert output([], []).total_num_scheduled_tokens == 0
    assert not output([], [], finished=["x"]).is_empty  # the worker must still drop x
    assert not output([new("a", 1)], []).is_empty
    assert not output([], [cached("c", 1)]).is_empty
