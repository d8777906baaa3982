import pytest

from scheduler.block_manager import BlockManager
from scheduler.output import SchedulerOutput
from scheduler.request import Request, RequestId, RequestStatus, SamplingParams
from scheduler.scheduler import Scheduler, SchedulerConfig

EOS = 0


def make_scheduler(
    *,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 8,
    max_model_len: int = 64,
    num_blocks: int = 16,
    block_size: int = 4,
    enable_chunked_prefill: bool = True,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs, max_num_batched_tokens, max_model_len, enable_chunked_prefill
    )
    return Scheduler(config, BlockManager(num_blocks, block_size))


def make_request(request_id: str, prompt: list[int], max_tokens: int = 16) -> Request:
    return Request(
        RequestId(request_id),
        list(prompt),
        SamplingParams(max_tokens=max_tokens),
        eos_token_ids=frozenset({EOS}),
    )


def new_of(output: SchedulerOutput) -> list[tuple]:
    return [
        (s.request.request_id, s.block_ids, s.num_computed_tokens, s.num_scheduled_tokens)
        for s in output.scheduled_new
    ]


def cached_of(output: SchedulerOutput) -> list[tuple]:
    return [
        (s.request_id, s.new_block_ids, s.num_computed_tokens, s.num_scheduled_tokens, s.resumed)
        for s in output.scheduled_cached
    ]


def step(s: Scheduler, sampled: dict[str, int]) -> tuple[SchedulerOutput, list[Request]]:
    output = s.schedule()
    updated = s.update_from_output(output, {RequestId(k): v for k, v in sampled.items()})
    s.check_invariants()
    return output, updated


def test_chunked_prefill_splits_exact_counts():
    s = make_scheduler(max_num_batched_tokens=8)
    r = make_request("a", list(range(1, 21)))
    s.add_request(r)
    out, updated = step(s, {})
    assert new_of(out) == [("a", [0, 1], 0, 8)]
    assert out.total_num_scheduled_tokens == 8 and updated == []
    out, updated = step(s, {})
    assert cached_of(out) == [("a", [2, 3], 8, 8, False)]
    out, updated = step(s, {"a": 7})
    assert cached_of(out) == [("a", [4], 16, 4, False)]
    assert updated == [r] and r.output_token_ids == [7]
    out, updated = step(s, {"a": 9})
    assert cached_of(out) == [("a", [5], 20, 1, False)]  # token 20 opens block 5
    assert r.output_token_ids == [7, 9] and r.num_computed_tokens == 21


def test_decodes_batch_with_a_chunked_prefill():
    s = make_scheduler(max_num_batched_tokens=8)
    for name in ("a", "b", "c"):
        s.add_request(make_request(name, [1, 2, 3] if name != "c" else [4, 5, 6, 7, 8]))
    out, updated = step(s, {"a": 10, "b": 11})
    # Partial blocks are never shared: a and b have blocks of their own.
    assert new_of(out) == [("a", [0], 0, 3), ("b", [1], 0, 3), ("c", [2], 0, 2)]
    assert [r.request_id for r in updated] == ["a", "b"]
    out, updated = step(s, {"a": 12, "b": 13, "c": 14})
    assert cached_of(out) == [
        ("a", [], 3, 1, False),
        ("b", [], 3, 1, False),
        ("c", [3], 2, 3, False),
    ]
    assert [r.request_id for r in updated] == ["a", "b", "c"]
    out, _ = step(s, {"a": 15, "b": 16, "c": 17})
    assert cached_of(out) == [
        ("a", [4], 4, 1, False),
        ("b", [5], 4, 1, False),
        ("c", [], 5, 1, False),
    ]
    assert out.num_scheduled_tokens(RequestId("c")) == 1
    assert out.num_scheduled_tokens(RequestId("zzz")) == 0


def test_max_num_seqs_limits_admission():
    s = make_scheduler(max_num_seqs=2, max_num_batched_tokens=32)
    for name, max_tokens in (("a", 1), ("b", 5), ("c", 5)):
        s.add_request(make_request(name, [1, 2, 3, int(name == "b") + 20], max_tokens))
    out, updated = step(s, {"a": 5, "b": 6})
    assert [n[0] for n in new_of(out)] == ["a", "b"]
    assert s.num_running == 1 and s.num_waiting == 1  # a finished by max_tokens
    assert updated[0].status is RequestStatus.FINISHED_LENGTH
    out, _ = step(s, {"b": 7, "c": 8})
    assert cached_of(out) == [("b", [2], 4, 1, False)]
    assert new_of(out) == [("c", [3], 0, 4)]
    assert out.finished_request_ids == ["a"]


def test_without_chunked_prefill_a_prompt_waits_for_room():
    s = make_scheduler(max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False)
    s.add_request(make_request("a", list(range(1, 11))))
    s.add_request(make_request("b", list(range(11, 21))))
    out, _ = step(s, {"a": 5})
    assert new_of(out) == [("a", [0, 1, 2], 0, 10)]
    out, _ = step(s, {"a": 5, "b": 6})
    assert cached_of(out) == [("a", [], 10, 1, False)]
    assert new_of(out) == [("b", [3, 4, 5], 0, 10)]
    with pytest.raises(ValueError):
        SchedulerConfig(4, 8, 16, enable_chunked_prefill=False)


def test_preemption_by_recompute_with_exact_blocks():
    s = make_scheduler(max_num_batched_tokens=32, max_model_len=16, num_blocks=4, block_size=4)
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7], max_tokens=3)
    b = make_request("b", [11, 12, 13, 14, 15, 16, 17])
    s.add_request(a)
    s.add_request(b)
    out, _ = step(s, {"a": 8, "b": 18})
    assert new_of(out) == [("a", [0, 1], 0, 7), ("b", [2, 3], 0, 7)]
    out, _ = step(s, {"a": 9, "b": 19})
    assert cached_of(out) == [("a", [], 7, 1, False), ("b", [], 7, 1, False)]
    assert s.kv_usage == 1.0
    # a needs a third block: b (latest) is preempted; its blocks 2 3 stay cached, b's
    # tail (3) is evicted first.
    out, updated = step(s, {"a": 10})
    assert cached_of(out) == [("a", [3], 8, 1, False)]
    assert out.preempted_request_ids == ["b"] and out.scheduled_new == []
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.num_preemptions == 1 and s.num_preemptions_total == 1
    assert s.num_preemptions_by_reason == {"kv_cache": 1, "priority": 0}
    assert a.is_finished and updated == [a]
    # b comes back: block 2 is a prefix hit; blocks 3 and 1 are fresh (1 evicts a's).
    out, _ = step(s, {"b": 20})
    assert out.finished_request_ids == ["a"]
    assert cached_of(out) == [("b", [2, 3, 1], 4, 5, True)]
    assert b.output_token_ids == [18, 19, 20]
    assert b.num_cached_tokens == 0  # usage.cached_tokens counts the first admission only
    assert s.prefix_cache_queried_tokens == 7 + 7 + 9
    assert s.prefix_cache_hit_tokens == 4
    out, _ = step(s, {"b": 21})
    assert cached_of(out) == [("b", [], 9, 1, False)]
    assert out.finished_request_ids == []


def test_request_preempts_itself_when_it_is_the_latest():
    s = make_scheduler(max_num_batched_tokens=32, max_model_len=16, num_blocks=4, block_size=4)
    s.add_request(make_request("a", [1, 2, 3, 4, 5]))
    s.add_request(make_request("b", [11, 12, 13, 14, 15, 16, 17, 18]))
    out, _ = step(s, {"a": 6, "b": 19})
    assert new_of(out) == [("a", [0, 1], 0, 5), ("b", [2, 3], 0, 8)]
    out, _ = step(s, {"a": 7})
    assert cached_of(out) == [("a", [], 5, 1, False)]
    assert out.preempted_request_ids == ["b"]
    assert s.num_running == 1 and s.num_waiting == 1


def test_abort_frees_blocks_at_once_and_is_reported_once():
    s = make_scheduler()
    a = make_request("a", list(range(1, 11)))
    s.add_request(a)
    s.add_request(make_request("never-run", [1, 2, 3]))
    out = s.schedule()
    assert new_of(out) == [("a", [0, 1], 0, 8)]  # the budget is spent: never-run waits
    assert s.block_manager.num_free_blocks == 14
    assert s.abort_request(RequestId("a")) is a
    assert a.status is RequestStatus.FINISHED_ABORTED
    assert s.block_manager.num_free_blocks == 16
    assert s.get_request(RequestId("a")) is None
    # The step was already in flight: its sampled token is dropped.
    assert s.update_from_output(out, {RequestId("a"): 5}) == []
    assert a.output_token_ids == []
    assert s.abort_request(RequestId("never-run")) is not None
    assert s.abort_request(RequestId("a")) is None
    assert s.abort_request(RequestId("unknown")) is None
    s.check_invariants()
    out = s.schedule()
    assert out.finished_request_ids == ["a"]  # never-run was never sent to the worker
    assert out.is_empty is False and out.total_num_scheduled_tokens == 0
    assert s.schedule().finished_request_ids == []
    assert not s.has_unfinished_requests


def test_abort_with_stop_status_for_stop_strings():
    s = make_scheduler()
    s.add_request(make_request("a", [1, 2, 3]))
    step(s, {"a": 4})
    r = s.abort_request(RequestId("a"), RequestStatus.FINISHED_STOPPED)
    assert r is not None and r.status is RequestStatus.FINISHED_STOPPED
    with pytest.raises(ValueError):
        s.abort_request(RequestId("a"), RequestStatus.RUNNING)


def test_eos_finishes_and_id_is_delivered_once():
    s = make_scheduler()
    r = make_request("a", [1, 2, 3])
    s.add_request(r)
    _, updated = step(s, {"a": 5})
    _, updated = step(s, {"a": EOS})
    assert updated == [r] and r.status is RequestStatus.FINISHED_STOPPED
    assert r.output_token_ids == [5, EOS]
    assert s.block_manager.num_free_blocks == 16
    out, _ = step(s, {})
    assert out.finished_request_ids == ["a"] and out.total_num_scheduled_tokens == 0
    out, _ = step(s, {})
    assert out.finished_request_ids == [] and out.is_empty


@pytest.mark.parametrize("stop", [EOS, 9])
def test_min_tokens_holds_back_eos_and_stop_token_ids(stop: int):
    s = make_scheduler()
    params = SamplingParams(max_tokens=16, min_tokens=3, stop_token_ids=(9,))
    r = Request(RequestId("a"), [1, 2, 3], params, eos_token_ids=frozenset({EOS}))
    s.add_request(r)
    # Three tokens come before a stop can count (the worker bans stops while fewer than
    # min_tokens are out): stops among them, had they slipped through, do not end it.
    for _ in range(3):
        _, updated = step(s, {"a": stop})
        assert updated == [r] and r.status is RequestStatus.RUNNING
    _, updated = step(s, {"a": stop})
    assert r.status is RequestStatus.FINISHED_STOPPED
    assert r.output_token_ids == [stop] * 4


def test_min_tokens_does_not_outlast_max_tokens():
    s = make_scheduler()
    r = Request(RequestId("a"), [1, 2, 3], SamplingParams(max_tokens=2, min_tokens=5), eos_token_ids=frozenset({EOS}))
    s.add_request(r)
    step(s, {"a": EOS})
    step(s, {"a": EOS})
    assert r.status is RequestStatus.FINISHED_LENGTH and r.output_token_ids == [EOS, EOS]


def test_max_model_len_finishes_with_length():
    s = make_scheduler(max_num_batched_tokens=16, max_model_len=16)
    r = make_request("a", list(range(1, 15)), max_tokens=100)
    s.add_request(r)
    step(s, {"a": 30})
    _, updated = step(s, {"a": 31})
    assert updated == [r] and r.status is RequestStatus.FINISHED_LENGTH
    assert r.num_tokens == 16


def test_cached_tokens_reported_on_prefix_hit():
    s = make_scheduler(max_num_batched_tokens=32)
    a = make_request("a", list(range(1, 13)))
    s.add_request(a)
    out, _ = step(s, {"a": 50})
    assert new_of(out) == [("a", [0, 1, 2], 0, 12)] and a.num_cached_tokens == 0
    b = make_request("b", list(range(1, 13)))
    s.add_request(b)
    out, _ = step(s, {"a": 51, "b": 60})
    assert cached_of(out) == [("a", [3], 12, 1, False)]
    # (12 - 1) // 4 == 2 blocks are hits; the third is recomputed so b can sample.
    assert new_of(out) == [("b", [0, 1, 4], 8, 4)]
    assert b.num_cached_tokens == 8
    assert s.prefix_cache_queried_tokens == 24 and s.prefix_cache_hit_tokens == 8


def test_missing_sampled_token_is_an_error():
    s = make_scheduler()
    s.add_request(make_request("a", [1, 2, 3]))
    out = s.schedule()
    with pytest.raises(ValueError):
        s.update_from_output(out, {})


def test_add_request_validation():
    s = make_scheduler(max_model_len=16)
    with pytest.raises(ValueError):
        s.add_request(make_request("long", list(range(16))))
    s.add_request(make_request("a", [1]))
    with pytest.raises(ValueError):
        s.add_request(make_request("a", [2]))
    with pytest.raises(ValueError):  # a pool that cannot hold one full-length request
        Scheduler(SchedulerConfig(4, 8, 65), BlockManager(16, 4))


def test_finished_id_can_be_reused_as_a_new_request():
    s = make_scheduler()
    s.add_request(make_request("a", [1, 2, 3], max_tokens=1))
    step(s, {"a": 4})
    s.add_request(make_request("a", [1, 2, 3, 4, 5]))
    out, _ = step(s, {"a": 6})
    assert out.finished_request_ids == ["a"]  # the worker drops the old "a" first
    assert [n[0] for n in new_of(out)] == ["a"] and out.scheduled_cached == []
