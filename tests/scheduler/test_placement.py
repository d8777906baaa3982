from __future__ import annotations

import random

import pytest

from scheduler.placement import (
    DEFAULT_WEIGHTS,
    PREFILL_WEIGHT,
    HotspotGuard,
    KVUtilizationScorer,
    LeastLoadedPlacement,
    PrefixAwarePlacement,
    PrefixCacheScorer,
    QueueScorer,
    RoundRobinPlacement,
    WorkerState,
    make_placement,
    parse_weights,
)


def w(worker_id: int, waiting: int = 0, running: int = 0, kv: float = 0.0, cached: int = 0) -> WorkerState:
    return WorkerState(worker_id, waiting, running, kv, cached)


def test_prefix_scorer_is_the_cached_fraction_of_prompt_blocks() -> None:
    workers = [w(0, cached=3), w(1, cached=0), w(2, cached=4)]
    assert PrefixCacheScorer().score(workers, 4) == [0.75, 0.0, 1.0]
    assert PrefixCacheScorer().score(workers, 0) == [0.0, 0.0, 0.0]


def test_load_weighs_requests_without_a_first_token_more() -> None:
    assert w(0, waiting=1, running=3).load == 3 + PREFILL_WEIGHT
    prefilling = WorkerState(0, 0, 3, 0.0, 0, num_prefilling=2)
    assert prefilling.load == 1 + 2 * PREFILL_WEIGHT


def test_queue_scorer_is_min_max_normalised_and_inverted() -> None:
    workers = [w(0, running=4), w(1, running=2), w(2, running=10)]
    # loads 4, 2, 10: idlest 1.0, busiest 0.0, 4 -> (10 - 4) / 8
    assert QueueScorer().score(workers, 1) == [0.75, 1.0, 0.0]
    assert QueueScorer().score([w(0, running=3), w(1, running=3)], 1) == [1.0, 1.0]


def test_kv_scorer_is_free_fraction() -> None:
    assert KVUtilizationScorer().score([w(0, kv=0.25), w(1, kv=1.0)], 1) == [0.75, 0.0]


def test_weighted_total_picks_the_cached_worker_over_a_slightly_idler_one() -> None:
    placement = PrefixAwarePlacement(rng=random.Random(0))
    # worker 0: prefix 1.0*3 + queue 0*2 + kv 0.9*2 = 4.8 ; worker 1: 0 + 1*2 + 1*2 = 4.0
    decision = placement.choose([w(0, running=3, kv=0.1, cached=8), w(1, running=1)], 8)
    assert decision.worker_id == 0
    assert decision.reason == "prefix"
    assert decision.scores == pytest.approx((4.8, 4.0))


def test_load_wins_when_nothing_is_cached() -> None:
    placement = PrefixAwarePlacement(rng=random.Random(0))
    decision = placement.choose([w(0, running=5, kv=0.5), w(1, running=1, kv=0.1)], 8)
    assert (decision.worker_id, decision.reason) == (1, "load")


def test_weights_change_the_outcome() -> None:
    workers = [w(0, running=3, kv=0.1, cached=8), w(1, running=1)]
    placement = PrefixAwarePlacement(weights={"prefix": 1.0, "queue": 2.0, "kv": 2.0})
    assert placement.choose(workers, 8).worker_id == 1


def test_ties_are_broken_at_random_and_seeded() -> None:
    workers = [w(0), w(1), w(2)]
    picks = {PrefixAwarePlacement(rng=random.Random(s)).choose(workers, 4).worker_id for s in range(40)}
    assert picks == {0, 1, 2}
    a = [PrefixAwarePlacement(rng=random.Random(7)).choose(workers, 4).worker_id for _ in range(5)]
    b = [PrefixAwarePlacement(rng=random.Random(7)).choose(workers, 4).worker_id for _ in range(5)]
    assert a == b
    assert PrefixAwarePlacement(rng=random.Random(1)).choose(workers, 4).reason == "tie"


def test_hotspot_guard_sends_to_the_idlest_when_both_margins_are_exceeded() -> None:
    placement = PrefixAwarePlacement(guard=HotspotGuard(min_extra_requests=8, min_ratio=2.0))
    hot = w(0, waiting=10, running=10, cached=16)  # load 20, every block cached
    idle = w(1, running=3)  # load 3: 17 more and over 2x
    decision = placement.choose([hot, idle], 16)
    assert (decision.worker_id, decision.reason) == (1, "hotspot")


@pytest.mark.parametrize(
    "hot_load, idle_load",
    [(11, 3), (20, 12)],  # only 8 more (not > 8); 8 more but under 2x
)
def test_hotspot_guard_needs_both_margins(hot_load: int, idle_load: int) -> None:
    placement = PrefixAwarePlacement(
        weights={"prefix": 3.0, "queue": 0.0, "kv": 0.0},
        guard=HotspotGuard(min_extra_requests=8, min_ratio=2.0),
    )
    decision = placement.choose([w(0, running=hot_load, cached=16), w(1, running=idle_load)], 16)
    assert (decision.worker_id, decision.reason) == (0, "prefix")


def test_single_worker_is_the_only_choice() -> None:
    assert PrefixAwarePlacement().choose([w(3, running=100)], 4).worker_id == 3


def test_round_robin_cycles_and_skips_workers_not_offered() -> None:
    rr = RoundRobinPlacement()
    all_up = [w(0), w(1), w(2)]
    assert [rr.choose(all_up, 1).worker_id for _ in range(4)] == [0, 1, 2, 0]
    worker_1_down = [w(0), w(2)]
    assert [rr.choose(worker_1_down, 1).worker_id for _ in range(3)] == [2, 0, 2]


def test_least_loaded_picks_minimum_load() -> None:
    ll = LeastLoadedPlacement(rng=random.Random(0))
    assert ll.choose([w(0, running=4), w(1, running=2), w(2, running=3)], 1).worker_id == 1
    # one request waiting for its prefill outweighs three decoding
    assert ll.choose([w(0, waiting=1), w(1, running=3)], 1).worker_id == 1


def test_policies_only_ever_pick_an_offered_worker() -> None:
    rng = random.Random(0)
    for policy in ("prefix-aware", "round-robin", "least-loaded"):
        placement = make_placement(policy, seed=3)
        for _ in range(200):
            offered = [
                w(i, rng.randrange(5), rng.randrange(20), rng.random(), rng.randrange(9))
                for i in range(4)
                if rng.random() < 0.6
            ] or [w(2)]
            decision = placement.choose(offered, 8)
            assert decision.worker_id in {x.worker_id for x in offered}


def test_parse_weights() -> None:
    assert parse_weights("") == DEFAULT_WEIGHTS
    assert parse_weights("prefix=1.5, kv=0") == {"prefix": 1.5, "queue": 2.0, "kv": 0.0}
    for bad in ("prefix", "cache=1", "kv=-1", "queue=x"):
        with pytest.raises(ValueError):
            parse_weights(bad)
    with pytest.raises(ValueError):
        make_placement("fastest")
