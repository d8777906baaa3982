import pytest

from scheduler.block_manager import BlockManager
from scheduler.request import Request, RequestId, SamplingParams
from scheduler.scheduler import Scheduler, SchedulerConfig


def make_request(request_id: str, prompt: list[int]) -> Request:
    return Request(RequestId(request_id), list(prompt), SamplingParams(max_tokens=16))


def admit(bm: BlockManager, request: Request) -> list[int]:
    """Admit with prefix hits and compute the whole prompt, as one scheduler step would."""
    computed, num_cached = bm.get_computed_blocks(request)
    num_new = request.num_tokens - num_cached
    assert bm.can_allocate(request, num_new, computed)
    blocks = bm.allocate(request, num_new, computed)
    request.num_computed_tokens = request.num_tokens
    bm.cache_full_blocks(request)
    bm.check_invariants()
    return blocks


def test_allocate_covers_tokens_and_counts_usage():
    bm = BlockManager(num_blocks=8, block_size=4)
    r = make_request("a", list(range(10)))
    assert bm.get_computed_blocks(r) == ([], 0)
    assert bm.allocate(r, 10) == [0, 1, 2]
    assert bm.block_ids(RequestId("a")) == [0, 1, 2]
    assert bm.num_free_blocks == 5
    assert bm.usage == 3 / 8
    bm.check_invariants()


def test_allocate_grows_by_new_blocks_only():
    bm = BlockManager(num_blocks=8, block_size=4)
    r = make_request("a", [1, 2, 3])
    assert bm.allocate(r, 3) == [0]
    r.num_computed_tokens = 3
    r.output_token_ids.append(4)
    assert bm.allocate(r, 1) == []  # token 3 fits in block 0's last slot
    r.num_computed_tokens = 4
    r.output_token_ids.append(5)
    assert bm.allocate(r, 1) == [1]
    assert bm.block_ids(RequestId("a")) == [0, 1]
    bm.check_invariants()


def test_prefix_hit_returns_exact_blocks_and_shares_them():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_request("a", list(range(10)))
    assert admit(bm, a) == [0, 1, 2]
    b = make_request("b", list(range(8)) + [50, 51, 52])
    assert bm.get_computed_blocks(b) == ([0, 1], 8)
    assert admit(bm, b) == [0, 1, 3]
    assert bm.num_free_blocks == 4
    bm.free(a)  # blocks 0 and 1 stay in use by b
    bm.check_invariants()
    assert bm.num_free_blocks == 5
    assert bm.block_ids(RequestId("a")) == []
    bm.free(b)
    bm.free(b)  # a second free is a no-op, not a double free
    bm.check_invariants()
    assert bm.num_free_blocks == 8
    assert bm.usage == 0.0


def test_hit_is_capped_to_leave_one_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4)
    admit(bm, make_request("a", list(range(8))))
    same = make_request("b", list(range(8)))
    assert bm.get_computed_blocks(same) == ([0], 4)  # (8 - 1) // 4 == 1
    longer = make_request("c", list(range(9)))
    assert bm.get_computed_blocks(longer) == ([0, 1], 8)
    assert bm.num_cached_prefix_blocks(list(range(8))) == 2  # placement: no cap


def test_lru_eviction_tail_first_oldest_freed_first():
    bm = BlockManager(num_blocks=4, block_size=2)
    r1 = make_request("r1", [1, 2, 3, 4])
    r2 = make_request("r2", [5, 6, 7, 8])
    assert admit(bm, r1) == [0, 1]
    bm.free(r1)  # free queue: 2 3 1 0
    assert admit(bm, r2) == [2, 3]
    bm.free(r2)  # free queue: 1 0 3 2
    assert bm.num_cached_prefix_blocks([1, 2, 3, 4]) == 2
    assert bm.num_cached_prefix_blocks([5, 6, 7, 8]) == 2
    r3 = make_request("r3", [9, 10])
    assert bm.allocate(r3, 2) == [1]  # r1's tail is evicted first
    assert bm.num_cached_prefix_blocks([1, 2, 3, 4]) == 1
    assert bm.num_cached_prefix_blocks([5, 6, 7, 8]) == 2
    r4 = make_request("r4", [11, 12, 13, 14, 15, 16])
    assert bm.allocate(r4, 6) == [0, 3, 2]
    assert bm.num_cached_prefix_blocks([1, 2, 3, 4]) == 0
    assert bm.num_cached_prefix_blocks([5, 6, 7, 8]) == 0
    assert bm.num_free_blocks == 0
    bm.check_invariants()


def test_freed_unhashed_block_is_reused_first():
    bm = BlockManager(num_blocks=4, block_size=2)
    r = make_request("r", [1, 2, 3])
    assert admit(bm, r) == [0, 1]  # block 1 holds one token: never hashed
    bm.free(r)  # free queue: 1 2 3 0
    assert bm.allocate(make_request("x", [7, 7, 7, 7, 7, 7]), 6) == [1, 2, 3]
    assert bm.num_cached_prefix_blocks([1, 2, 3]) == 1


def test_touching_free_cached_blocks_counts_against_capacity():
    bm = BlockManager(num_blocks=3, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    admit(bm, a)  # blocks 0 1 hashed, 2 partial
    bm.free(a)
    assert bm.num_free_blocks == 3
    b = make_request("b", [1, 2, 3, 4, 9, 9, 9])  # 4 blocks: 2 cached + 2 new > 3 free
    computed, num_cached = bm.get_computed_blocks(b)
    assert (computed, num_cached) == ([0, 1], 4)
    assert not bm.can_allocate(b, 3, computed)
    with pytest.raises(RuntimeError):
        bm.allocate(b, 3, computed)
    bm.check_invariants()
    c = make_request("c", [1, 2, 3, 4, 9])
    computed, num_cached = bm.get_computed_blocks(c)
    assert bm.can_allocate(c, 1, computed)
    assert bm.allocate(c, 1, computed) == [0, 1, 2]
    assert bm.num_free_blocks == 0
    bm.check_invariants()


def test_duplicate_hash_keeps_first_mapping():
    bm = BlockManager(num_blocks=8, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    b = make_request("b", [1, 2, 3, 4, 5])
    assert bm.allocate(a, 5) == [0, 1, 2]
    assert bm.allocate(b, 5) == [3, 4, 5]  # admitted before a's blocks were cached
    for r in (a, b):
        r.num_computed_tokens = 5
        bm.cache_full_blocks(r)
    bm.check_invariants()
    assert bm.get_computed_blocks(make_request("c", [1, 2, 3, 4, 5])) == ([0, 1], 4)
    # b's next full block chains from its (unregistered) duplicates and is cached.
    b.output_token_ids.append(6)
    b.num_computed_tokens = 6
    bm.cache_full_blocks(b)
    assert bm.get_computed_blocks(make_request("d", [1, 2, 3, 4, 5, 6, 7])) == ([0, 1, 5], 6)
    bm.free(a)
    bm.free(b)
    bm.check_invariants()
    assert bm.num_free_blocks == 8


def test_cache_full_blocks_hashes_output_tokens_once_computed():
    bm = BlockManager(num_blocks=8, block_size=2)
    r = make_request("r", [1, 2, 3])
    admit(bm, r)
    r.output_token_ids.append(4)  # sampled, but its KV is not computed yet
    bm.cache_full_blocks(r)
    assert bm.num_cached_prefix_blocks([1, 2, 3, 4]) == 1
    assert bm.allocate(r, 1) == []
    r.num_computed_tokens = 4
    bm.cache_full_blocks(r)
    assert bm.num_cached_prefix_blocks([1, 2, 3, 4]) == 2
    bm.check_invariants()


def test_reset_prefix_cache_and_disabled_cache():
    bm = BlockManager(num_blocks=4, block_size=2)
    admit(bm, make_request("a", [1, 2, 3, 4, 5]))
    assert bm.num_cached_prefix_blocks([1, 2, 3, 4]) == 2
    bm.reset_prefix_cache()
    bm.check_invariants()
    assert bm.num_cached_prefix_blocks([1, 2, 3, 4]) == 0
    assert bm.get_computed_blocks(make_request("b", [1, 2, 3, 4, 5])) == ([], 0)

    off = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    admit(off, make_request("a", [1, 2, 3, 4, 5]))
    assert off.get_computed_blocks(make_request("b", [1, 2, 3, 4, 5])) == ([], 0)
    assert off.num_cached_prefix_blocks([1, 2, 3, 4]) == 0
    off.check_invariants()


def test_computed_blocks_only_on_first_allocation():
    bm = BlockManager(num_blocks=4, block_size=2)
    admit(bm, make_request("a", [1, 2, 3]))
    b = make_request("b", [1, 2, 3])
    bm.allocate(b, 1)
    with pytest.raises(ValueError):
        bm.allocate(b, 1, [0])


def test_check_invariants_catches_corruption():
    bm = BlockManager(num_blocks=4, block_size=2)
    admit(bm, make_request("a", [1, 2, 3]))
    bm._blocks[0].ref_count += 1
    with pytest.raises(AssertionError):
        bm.check_invariants()
    bm._blocks[0].ref_count -= 1
    bm.check_invariants()
    bm._free[0] = None  # an in-use block in the free queue
    with pytest.raises(AssertionError):
        bm.check_invariants()


# -- free(uncache=True): the request's last step never ran ---------------------------------


def test_free_uncache_drops_only_blocks_no_other_request_holds():
    shared = list(range(8))
    b_prompt = shared + [50, 51, 52, 53, 54]  # blocks: shared 0 1, own full 3, own partial 4
    for uncache in (False, True):
        bm = BlockManager(num_blocks=8, block_size=4)
        a = make_request("a", list(range(10)))
        assert admit(bm, a) == [0, 1, 2]
        b = make_request("b", b_prompt)
        assert admit(bm, b) == [0, 1, 3, 4]
        assert bm.get_computed_blocks(make_request("probe", b_prompt)) == ([0, 1, 3], 12)
        bm.free(b, uncache=uncache)
        bm.check_invariants()
        assert bm.num_free_blocks == 5
        if not uncache:  # the control: a plain free keeps b's own full block cached
            assert bm.get_computed_blocks(make_request("again", b_prompt)) == ([0, 1, 3], 12)
            assert bm.occupancy == 4 / 8
            continue
        # block 3 only b held: gone from the cache; 0 and 1 are a's too, so they stay
        assert bm.get_computed_blocks(make_request("again", b_prompt)) == ([0, 1], 8)
        assert bm.num_cached_prefix_blocks(b_prompt) == 2
        assert bm.occupancy == 3 / 8
        # an uncached block holds nothing reusable: reused first, like an unhashed tail
        assert bm.allocate(make_request("x", [9]), 1) == [3]
        bm.check_invariants()
        bm.free(a, uncache=True)  # now no one else holds 0, 1, 2
        bm.check_invariants()
        assert bm.get_computed_blocks(make_request("fresh", list(range(10)))) == ([], 0)
        assert bm.num_free_blocks == 7 and bm.occupancy == 1 / 8


def test_free_uncache_keeps_an_equal_hash_another_block_holds():
    bm = BlockManager(num_blocks=8, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    assert admit(bm, a) == [0, 1, 2]
    dup = make_request("dup", [1, 2, 3, 4, 5])
    assert bm.allocate(dup, 5) == [3, 4, 5]  # admitted without its hits: unhashed duplicates
    dup.num_computed_tokens = 5
    bm.cache_full_blocks(dup)
    bm.check_invariants()
    bm.free(dup, uncache=True)
    bm.check_invariants()
    assert bm.get_computed_blocks(make_request("c", [1, 2, 3, 4, 5])) == ([0, 1], 4)
    bm.free(a)
    bm.check_invariants()
    assert bm.num_free_blocks == 8 and bm.occupancy == 2 / 8


def test_scheduler_abort_with_uncache_after_a_step_that_never_ran():
    s = Scheduler(SchedulerConfig(4, 32, 64), BlockManager(16, 4))
    a = make_request("a", list(range(1, 11)))
    s.add_request(a)
    out = s.schedule()
    assert [(r.request.request_id, r.block_ids) for r in out.scheduled_new] == [("a", [0, 1, 2])]
    s.update_from_output(out, {RequestId("a"): 100})
    s.check_invariants()
    b_prompt = list(range(1, 9)) + [60, 61, 62, 63, 64]
    s.add_request(make_request("b", b_prompt))
    out = s.schedule()  # a decodes; b hits a's two blocks (written by step 1) and adds 3, 4
    new = [(r.request.request_id, r.block_ids, r.num_computed_tokens) for r in out.scheduled_new]
    assert new == [("b", [0, 1, 3, 4], 8)]
    assert s.block_manager.num_cached_prefix_blocks(b_prompt) == 3  # hashed at schedule time
    # the worker dropped b from this step: its block 3 was never written
    assert s.abort_request(RequestId("b"), uncache=True) is not None
    s.check_invariants()
    assert s.block_manager.num_cached_prefix_blocks(b_prompt) == 2
    assert s.block_manager.get_computed_blocks(make_request("c", b_prompt)) == ([0, 1], 8)
    assert [r.request_id for r in s.update_from_output(out, {RequestId("a"): 101})] == ["a"]
    s.check_invariants()
    assert s.schedule().finished_request_ids == ["b"]
    s.check_invariants()


def test_scheduler_uncache_when_the_sharer_joined_in_the_same_step():
    s = Scheduler(SchedulerConfig(4, 64, 64), BlockManager(16, 4))
    a_prompt = list(range(1, 11))
    s.add_request(make_request("a", a_prompt))
    s.add_request(make_request("b", list(range(1, 9)) + [60, 61, 62]))
    out = s.schedule()
    new = [(r.request.request_id, r.block_ids, r.num_computed_tokens) for r in out.scheduled_new]
    assert new == [("a", [0, 1, 2], 0), ("b", [0, 1, 3], 8)]  # b reads a's blocks in this step
    # The worker drops a, and with it b, which reads blocks a never wrote (LLMRunner's
    # _load_media); the engine aborts both with uncache.
    s.abort_request(RequestId("a"), uncache=True)
    s.check_invariants()
    assert s.block_manager.num_cached_prefix_blocks(a_prompt) == 2  # b still holds 0 and 1
    s.abort_request(RequestId("b"), uncache=True)
    s.check_invariants()
    assert s.block_manager.num_cached_prefix_blocks(a_prompt) == 0


def test_cache_salt_shares_blocks_only_within_the_same_salt():
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(10))
    assert admit(bm, make_request("plain", prompt)) == [0, 1, 2]
    salted = Request(RequestId("a1"), list(prompt), SamplingParams(max_tokens=16), cache_salt="tenant-a")
    assert bm.get_computed_blocks(salted) == ([], 0)  # the unsalted blocks are not its
    assert admit(bm, salted) == [3, 4, 5]
    again = Request(RequestId("a2"), list(prompt), SamplingParams(max_tokens=16), cache_salt="tenant-a")
    assert bm.get_computed_blocks(again) == ([3, 4], 8)
    other = Request(RequestId("b1"), list(prompt), SamplingParams(max_tokens=16), cache_salt="tenant-b")
    assert bm.get_computed_blocks(other) == ([], 0)
    assert bm.get_computed_blocks(make_request("plain2", prompt)) == ([0, 1], 8)  # unsalted as before
    assert bm.num_cached_prefix_blocks(prompt, cache_salt="tenant-a") == 2
    assert bm.num_cached_prefix_blocks(prompt, cache_salt="tenant-c") == 0
    bm.check_invariants()
