"""The scheduler's share of speculative decoding: drafts the worker holds are scheduled after a
decoding request's next token within the budget, max_tokens and max_model_len; the result's
tokens are appended up to a stop; rejected drafts' positions are computed again; the prefix cache
never hashes an unverified token."""

from __future__ import annotations

from scheduler.block_manager import BlockManager
from scheduler.request import Request, RequestId, SamplingParams
from scheduler.scheduler import Scheduler, SchedulerConfig

EOS = 0


def make(*, budget: int = 32, max_model_len: int = 64, blocks: int = 32, max_running: int | None = None) -> Scheduler:
    config = SchedulerConfig(4, budget, max_model_len, speculative_max_running=max_running)
    return Scheduler(config, BlockManager(blocks, 4, enable_prefix_caching=True))


def request(rid: str, prompt: list[int], max_tokens: int = 32) -> Request:
    r = Request(RequestId(rid), list(prompt), SamplingParams(max_tokens=max_tokens), eos_token_ids=frozenset({EOS}))
    r.speculate = True
    return r


def prefill(s: Scheduler, r: Request, token: int, drafts: int) -> None:
    s.add_request(r)
    out = s.schedule()
    s.update_from_output(out, {r.request_id: token}, {r.request_id: drafts})
    s.check_invariants()


def test_drafts_are_scheduled_after_the_next_token_and_rejected_ones_recomputed() -> None:
    s = make()
    r = request("a", [5, 6, 7, 8, 9, 10])
    prefill(s, r, 11, drafts=3)
    out = s.schedule()
    (c,) = out.scheduled_cached
    assert (c.num_computed_tokens, c.num_scheduled_tokens, c.num_draft_tokens) == (6, 4, 3)
    assert out.num_draft_tokens == 3 and out.total_num_scheduled_tokens == 4
    assert r.num_computed_tokens == 10
    # one draft accepted, then the correction: positions 8 and 9 are computed again
    s.update_from_output(out, {r.request_id: [12, 13]}, {r.request_id: 2})
    s.check_invariants()
    assert r.output_token_ids == [11, 12, 13] and r.num_computed_tokens == 8
    out = s.schedule()
    (c,) = out.scheduled_cached
    assert (c.num_computed_tokens, c.num_scheduled_tokens, c.num_draft_tokens) == (8, 3, 2)
    # no drafts held: a plain decode
    s.update_from_output(out, {r.request_id: [14, 15, 16]})  # both drafts right, and one more
    assert r.num_computed_tokens == 11 and r.num_tokens == 12 and r.num_draft_tokens == 0
    out = s.schedule()
    assert out.scheduled_cached[0].num_scheduled_tokens == 1 and out.num_draft_tokens == 0


def test_drafts_fit_the_budget_max_tokens_and_max_model_len() -> None:
    s = make(budget=3)
    r = request("a", [1, 2], max_tokens=10)
    prefill(s, r, 5, drafts=6)
    assert s.schedule().scheduled_cached[0].num_draft_tokens == 2  # the budget: 1 + 2
    s = make()
    r = request("b", [1, 2, 3, 4], max_tokens=3)
    prefill(s, r, 5, drafts=6)
    assert s.schedule().scheduled_cached[0].num_draft_tokens == 1  # 2 tokens left to emit
    s = make(max_model_len=8)
    r = request("c", [1, 2, 3, 4, 5], max_tokens=30)
    prefill(s, r, 6, drafts=6)
    assert s.schedule().scheduled_cached[0].num_draft_tokens == 1  # 6 known, 8 at most


def test_tokens_after_a_stop_are_dropped() -> None:
    s = make()
    r = request("a", [1, 2, 3, 4])
    prefill(s, r, 5, drafts=4)
    out = s.schedule()
    (updated,) = s.update_from_output(out, {r.request_id: [6, EOS, 7, 8]})
    assert updated is r and r.is_finished and r.output_token_ids == [5, 6, EOS]
    assert not s.has_unfinished_requests
    s.check_invariants()


def test_no_drafts_above_the_running_limit() -> None:
    s = make(max_running=1)
    a, b = request("a", [1, 2, 3, 4]), request("b", [9, 8, 7, 6])
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    s.update_from_output(out, {a.request_id: 5, b.request_id: 5}, {a.request_id: 3, b.request_id: 3})
    out = s.schedule()
    assert out.num_draft_tokens == 0 and out.total_num_scheduled_tokens == 2


def test_the_prefix_cache_hashes_verified_tokens_only() -> None:
    s = make()
    r = request("a", [1, 2, 3, 4, 5, 6])
    prefill(s, r, 7, drafts=5)  # block 1 holds 5, 6, 7 and a draft
    hashes = s.block_manager._hashes[r.request_id]
    assert len(hashes) == 1
    out = s.schedule()  # computes positions 6..11: blocks 1 and 2 fill with drafts
    assert r.num_computed_tokens == 12 and len(hashes) == 1
    s.update_from_output(out, {r.request_id: [8, 99]})  # one draft right, then a correction
    assert r.num_computed_tokens == 8
    out = s.schedule()  # now block 1 holds verified tokens 5, 6, 7, 8 only
    assert len(hashes) == 2
    twin = request("b", [1, 2, 3, 4, 5, 6, 7, 8, 99, 1])
    s.update_from_output(out, {r.request_id: 3})
    blocks, hits = s.block_manager.get_computed_blocks(twin)
    assert hits == 8 and blocks == s.block_manager.block_ids(r.request_id)[:2]


def test_preemption_forgets_the_drafts() -> None:
    s = make(blocks=4, budget=32, max_model_len=16)  # 16 slots
    a = request("a", [1, 2, 3, 4, 5, 6, 7])
    prefill(s, a, 8, drafts=4)
    b = request("b", [9, 8, 7, 6, 5])
    s.add_request(b)
    out = s.schedule()  # a asks 5 slots, b 5 more: only a fits, b waits
    assert [c.request_id for c in out.scheduled_cached] == [a.request_id]
    s.update_from_output(out, {a.request_id: [9]}, {a.request_id: 4})
    a.num_draft_tokens = 4
    s._preempt(a, "kv_cache")
    assert a.num_draft_tokens == 0 and a.num_computed_tokens == 0
