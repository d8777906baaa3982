"""Requests that want prompt logprobs recompute their whole prompt; prefill-only requests
(max_tokens 0) end when their prompt is computed, with no token."""

from __future__ import annotations

import dataclasses

from scheduler.block_manager import BlockManager
from scheduler.request import Request, RequestId, RequestStatus, SamplingParams
from scheduler.scheduler import Scheduler, SchedulerConfig
from tests.scheduler.test_scheduler import cached_of, make_request, make_scheduler, new_of, step


def with_params(request: Request, **changes: object) -> Request:
    request.sampling_params = dataclasses.replace(request.sampling_params, **changes)  # type: ignore[arg-type]
    return request


def test_prompt_logprobs_take_no_cached_blocks_yet_publish_their_own() -> None:
    s = make_scheduler(max_num_batched_tokens=32)
    s.add_request(make_request("a", list(range(1, 13))))
    step(s, {"a": 50})
    b = with_params(make_request("b", list(range(1, 17))), prompt_logprobs=0)
    s.add_request(b)
    out, _ = step(s, {"a": 51, "b": 60})
    # a's three full blocks are cached, yet b computes all 16 prompt tokens in fresh blocks
    # (a took block 3 for its decode first)
    assert new_of(out) == [("b", [4, 5, 6, 7], 0, 16)]
    assert b.num_cached_tokens == 0
    # b asked nothing of the cache, so the hit rate counts a's query only
    assert (s.prefix_cache_queried_tokens, s.prefix_cache_hit_tokens) == (12, 0)
    # b's first three blocks equal a's, which stay the canonical ones; its fourth is new and
    # b publishes it: a newcomer with b's prompt hits a's three blocks and b's fourth
    c = make_request("c", [*range(1, 17), 5])
    s.add_request(c)
    out, _ = step(s, {"a": 52, "b": 61, "c": 70})
    assert new_of(out)[0][:3] == ("c", [0, 1, 2, 7, 9], 16)


def test_a_preempted_prompt_logprobs_request_recomputes_from_zero() -> None:
    s = Scheduler(SchedulerConfig(4, 16, 20), BlockManager(5, 4))
    b = make_request("b", list(range(20, 28)), max_tokens=2)
    a = with_params(make_request("a", list(range(1, 9))), prompt_logprobs=1)
    s.add_request(b)
    s.add_request(a)
    step(s, {"b": 9, "a": 9})  # four of the five blocks: two full ones each, published
    out, _ = step(s, {"b": 10})  # b takes the last block for its decode; a must give way
    assert out.preempted_request_ids == ["a"]
    out, _ = step(s, {"a": 11})  # b is done: a comes back
    # a's two prompt blocks are still cached, yet a recomputes all of its 9 tokens
    assert s.block_manager.num_cached_prefix_blocks(list(range(1, 9))) == 2
    assert [c[2:] for c in cached_of(out)] == [(0, 9, True)]
    assert a.output_token_ids == [9, 11]


def test_a_prefill_only_request_ends_with_its_last_chunk_and_no_token() -> None:
    s = make_scheduler(max_num_batched_tokens=8)
    r = with_params(make_request("a", list(range(1, 13)), max_tokens=0), prompt_logprobs=2)
    assert r.sampling_params.prefill_only
    s.add_request(r)
    out, updated = step(s, {})
    assert new_of(out) == [("a", [0, 1], 0, 8)] and updated == []
    out, updated = step(s, {})  # no sampled token is expected, nor accepted as missing
    assert cached_of(out) == [("a", [2], 8, 4, False)]
    assert updated == [r] and r.status is RequestStatus.FINISHED_LENGTH
    assert r.output_token_ids == [] and not s.has_unfinished_requests
    out, _ = step(s, {})
    assert out.finished_request_ids == ["a"]  # the worker drops it with the next step
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


def test_a_prefill_only_request_beside_decodes() -> None:
    s = Scheduler(SchedulerConfig(4, 16, 64), BlockManager(16, 4))
    s.add_request(make_request("d", [1, 2, 3], max_tokens=3))
    s.add_request(with_params(make_request("p", [4, 5, 6, 7, 8], max_tokens=0), prompt_logprobs=0))
    _, updated = step(s, {"d": 9})
    assert [(r.request_id, r.output_token_ids, r.status) for r in updated] == [
        ("d", [9], RequestStatus.RUNNING),
        ("p", [], RequestStatus.FINISHED_LENGTH),
    ]
    _, updated = step(s, {"d": 10})
    assert [r.request_id for r in updated] == ["d"]


def test_params_default_to_reading_the_cache() -> None:
    r = Request(RequestId("x"), [1], SamplingParams(max_tokens=1))
    assert r.reads_prefix_cache and not r.sampling_params.prefill_only
    assert not with_params(r, prompt_logprobs=0).reads_prefix_cache
