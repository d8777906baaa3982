"""Suffix decoding's trees: exact counts after inserts and removals (against counting every
substring), and drafts on hand-made sequences, rule by rule (gpu_workers/spec/suffix.py)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable

import pytest

from gpu_workers.spec.suffix import SuffixCache, SuffixTree


def substrings(sequences: Iterable[list[int]], depth: int) -> Counter[tuple[int, ...]]:
    counts: Counter[tuple[int, ...]] = Counter()
    for seq in sequences:
        for start in range(len(seq)):
            for n in range(1, min(depth, len(seq) - start) + 1):
                counts[tuple(seq[start : start + n])] += 1
    return counts


def count(tree: SuffixTree, string: list[int]) -> int:
    node = tree.find(string)
    return 0 if node is None else tree.count(node)


def test_counts_every_string_up_to_the_depth() -> None:
    tree = SuffixTree(3)
    tree.add(0, [1, 2, 1, 2, 3])
    assert tree.counts[0] == 5  # the root: every token
    assert count(tree, [1]) == 2 and count(tree, [2]) == 2 and count(tree, [3]) == 1
    assert count(tree, [1, 2]) == 2 and count(tree, [2, 1]) == 1 and count(tree, [2, 3]) == 1
    assert count(tree, [1, 2, 1]) == 1 and count(tree, [1, 2, 3]) == 1
    assert count(tree, [3, 1]) == 0 and count(tree, [1, 2, 1, 2]) == 0  # absent; deeper than the tree
    assert tree.num_nodes == 4  # the root, "1", "2", "1 2": strings seen once are tips, not nodes
    tree.add(1, [2, 1, 2, 1])
    assert count(tree, [2, 1]) == 3 and count(tree, [1, 2, 1]) == 2 and count(tree, [2, 1, 2]) == 2
    tree.remove(0)
    assert count(tree, [1, 2, 3]) == 0 and count(tree, [2, 1]) == 2 and count(tree, [1, 2]) == 1
    tree.remove(1)
    assert tree.counts[0] == 0 and not tree.sequences
    assert tree.num_nodes == 1  # every node back on the free list
    tree.add(2, [1, 2, 1, 2])
    assert count(tree, [1, 2]) == 2 and tree.num_nodes == 4  # freed ids reused


@pytest.mark.parametrize("seed", range(6))
def test_counts_match_counting_every_substring(seed: int) -> None:
    """Sequences added whole or a few tokens at a time, others removed, over a small alphabet
    (so strings repeat and tips turn into nodes and back): every substring's count is exact."""
    rng = random.Random(seed)
    depth = rng.randint(1, 6)
    tree = SuffixTree(depth)
    held: dict[int, list[int]] = {}
    for key in range(12):
        if held and rng.random() < 0.35:
            gone = rng.choice(sorted(held))
            tree.remove(gone)
            del held[gone]
        seq = [rng.randint(0, 3) for _ in range(rng.randint(1, 20))]
        for at in range(0, len(seq), 3):
            tree.extend(key, seq[at : at + 3])
        tree.add(key, [])  # finished: its handles go
        held[key] = seq
        want = substrings(held.values(), depth)
        for string, n in want.items():
            assert count(tree, list(string)) == n, string
        assert count(tree, [4]) == 0
        assert tree.counts[0] == sum(len(s) for s in held.values())


def cache(depth: int = 24, cached: int = 0, factor: float = 1.0, min_prob: float = 0.1) -> SuffixCache:
    return SuffixCache(depth, cached, factor, min_prob)


PASSAGE = list(range(10, 20))


def test_a_repeated_passage_gives_its_continuation() -> None:
    tokens = PASSAGE + [10, 11, 12]  # the passage's first 3 tokens again: a 3-token match
    assert cache().draft("a", tokens, len(tokens), 5) == [13, 14, 15]  # at most 1.0 x the match
    assert cache(factor=2.0).draft("a", tokens, len(tokens), 5) == [13, 14, 15, 16, 17]  # then k
    assert cache(factor=0.5).draft("a", tokens, len(tokens), 5) == [13]  # floor(1.5)
    assert cache(factor=2.0).draft("a", tokens, len(tokens), 0) == []
    assert cache().draft("a", PASSAGE, len(PASSAGE), 5) == []  # nothing occurs twice


def test_the_depth_leaves_the_draft_room() -> None:
    """A match as long as the tree is deep leaves no room: the draft starts from the suffix of
    the match that allows the most tokens (depth 6: 3 matched, 3 drafted)."""
    tokens = PASSAGE + PASSAGE[:8]
    assert cache(depth=6).draft("a", tokens, 0, 5) == [18, 19, 10]
    assert cache(depth=24).draft("a", tokens, 0, 5) == [18, 19, 10, 11, 12]


# "1 2" occurred three times: followed by 3 once and by 4 twice; "1 2 4" by 9, then by 5
BRANCHING = [7, 1, 2, 3, 8, 1, 2, 4, 9, 1, 2, 4, 5, 1, 2]


def test_the_most_frequent_branch_is_followed() -> None:
    # 4 with probability 2/3, then 9 (tied with 5, counted first) with 2/3 * 1/2
    assert cache().draft("a", BRANCHING, 0, 4) == [4, 9]


@pytest.mark.parametrize(("min_prob", "draft"), [(0.0, [4, 9]), (0.3, [4, 9]), (0.34, [4]), (0.66, [4]), (0.7, [])])
def test_min_token_prob_cuts_the_draft(min_prob: float, draft: list[int]) -> None:
    assert cache(min_prob=min_prob).draft("a", BRANCHING, 0, 4) == draft


def test_the_global_tree_drafts_for_a_new_request() -> None:
    c = cache(cached=10)
    prompt, output = [1, 2, 3], list(range(50, 60))
    c.draft("a", prompt + output, len(prompt), 4)
    c.release("a")
    assert "a" not in c.requests
    assert c.global_tree.sequences == {0: output}  # its output only
    # a new request repeating the start of that output: its own tree has nothing
    assert c.draft("b", [7, 8, 50, 51, 52], 2, 4) == [53, 54, 55]
    assert c.draft("c", [9, 1, 2], 2, 4) == []  # a's prompt was not kept
    assert cache(cached=0).draft("b", [7, 8, 50, 51, 52], 2, 4) == []


def test_the_own_tree_wins_a_tie_and_the_better_score_wins() -> None:
    c = cache(cached=10)
    c.draft("a", [0, 1, 2, 5, 6], 0, 4)
    c.release("a")  # the global tree: "1 2" -> 5 6
    assert c.draft("b", [3, 1, 2, 7, 8, 1, 2], 0, 2) == [7, 8]  # both score 2: the request's own
    c.draft("d", [0, 1, 2, 5, 6], 0, 4)
    c.release("d")  # "1 2" -> 5 6 twice: probability 1, score 2
    # the own tree: "1 2" was followed by 7 and by 8, so 7 (counted first) scores 1/2 + 1/2
    assert c.draft("e", [3, 1, 2, 7, 9, 1, 2, 8, 1, 2], 0, 2) == [5, 6]


def test_eviction_bounds_the_global_tree() -> None:
    c = cache(cached=2)
    outputs = {"a": [20, 21, 22, 23], "b": [30, 31, 32, 33], "c": [40, 41, 42, 43]}
    for request_id, output in outputs.items():
        c.draft(request_id, [1] + output, 1, 3)
        c.release(request_id)
    assert list(c.global_tree.sequences.values()) == [outputs["b"], outputs["c"]]  # the oldest left
    assert c.global_tree.counts[0] == 8
    assert c.draft("x", [5, 20, 21], 1, 3) == []  # a's output is gone, counts and all
    assert c.draft("y", [5, 30, 31], 1, 3) == [32, 33]
    c.release("x")  # its output [20, 21] joins, b's leaves
    c.release("y")  # [30, 31] joins, c's leaves
    assert list(c.global_tree.sequences.values()) == [[20, 21], [30, 31]]
    assert c.draft("z", [5, 30], 1, 3) == [31]


def test_drafting_as_the_sequence_grows_equals_counting_it_afresh() -> None:
    rng = random.Random(3)
    tokens = [rng.randint(0, 5) for _ in range(300)]
    grown = cache(depth=8, min_prob=0.05)
    for end in range(1, len(tokens) + 1, 7):
        assert grown.draft("a", tokens[:end], 1, 6) == cache(depth=8, min_prob=0.05).draft("a", tokens[:end], 1, 6)


def test_a_sequence_that_changed_is_counted_afresh() -> None:
    c = cache()
    c.draft("a", PASSAGE + [10, 11], 0, 4)
    other = [5, 6, 7, 5, 6]
    assert c.draft("a", other, 0, 4) == cache().draft("a", other, 0, 4) == [7, 5]  # shorter
    changed = [5, 6, 7, 5, 9, 5]
    assert c.draft("a", changed, 0, 4) == cache().draft("a", changed, 0, 4) == [6]  # last seen token differs
    assert c.requests["a"].tokens == changed
