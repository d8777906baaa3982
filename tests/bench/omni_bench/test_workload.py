import pytest

from bench.omni_bench.workload import (
    Conversation,
    LengthRange,
    MultiTurnWorkload,
    RandomWorkload,
    SharedPrefixWorkload,
)

WORKLOADS = [
    RandomWorkload(20, LengthRange(5, 40), LengthRange(8, 64)),
    SharedPrefixWorkload(3, 4, 50, LengthRange(4, 9), LengthRange(16, 16)),
    MultiTurnWorkload(4, 3, LengthRange(6, 12), LengthRange(4, 32)),
]


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_same_seed_same_requests_other_seed_other_requests(workload):
    assert workload.conversations(7) == workload.conversations(7)
    assert workload.conversations(7) != workload.conversations(8)


def test_random_lengths_stay_in_range():
    conversations = RandomWorkload(50, LengthRange(5, 9), LengthRange(8, 10)).conversations(0)
    assert [c.conversation_id for c in conversations] == list(range(50))
    assert {len(c.user_turns[0].split()) for c in conversations} == {5, 6, 7, 8, 9}
    assert {c.max_tokens[0] for c in conversations} == {8, 9, 10}
    assert all(c.num_turns == 1 and c.system_prompt is None for c in conversations)


def test_shared_prefix_groups_share_exactly_their_prefix():
    workload = SharedPrefixWorkload(3, 4, 50, LengthRange(6, 6), LengthRange(16, 16), order="grouped")
    conversations = workload.conversations(1)
    assert [c.group for c in conversations] == [0] * 4 + [1] * 4 + [2] * 4
    prefixes = {}
    for c in conversations:
        assert len(c.system_prompt.split()) == 50
        prefixes.setdefault(c.group, set()).add(c.system_prompt)
        # The question is the only user message and carries nothing of the prefix.
        assert c.messages([]) == [{"role": "system", "content": c.system_prompt},
                                  {"role": "user", "content": c.user_turns[0]}]
    assert all(len(p) == 1 for p in prefixes.values())  # one prefix per group ...
    assert len(set().union(*prefixes.values())) == 3  # ... and distinct across groups
    assert len({c.user_turns[0] for c in conversations}) == 12


def test_shared_prefix_orders():
    def groups(order, seed=0):
        w = SharedPrefixWorkload(3, 2, 10, LengthRange(3, 3), LengthRange(4, 4), order=order)
        return [(c.group, c.user_turns[0].split(":")[0]) for c in w.conversations(seed)]

    assert groups("grouped") == [(0, "Question 0"), (0, "Question 1"), (1, "Question 0"),
                                 (1, "Question 1"), (2, "Question 0"), (2, "Question 1")]
    assert groups("interleaved") == [(0, "Question 0"), (1, "Question 0"), (2, "Question 0"),
                                     (0, "Question 1"), (1, "Question 1"), (2, "Question 1")]
    shuffled = groups("random")
    assert sorted(shuffled) == sorted(groups("grouped")) and shuffled != groups("grouped")
    assert shuffled == groups("random") and shuffled != groups("random", seed=1)


def test_multi_turn_resends_history_with_replies():
    c = Conversation(0, ("hi there", "and then", "bye"), (4, 4, 4), system_prompt="be brief")
    assert c.messages([]) == [{"role": "system", "content": "be brief"},
                              {"role": "user", "content": "hi there"}]
    assert c.messages(["R0", "R1"]) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "R0"},
        {"role": "user", "content": "and then"},
        {"role": "assistant", "content": "R1"},
        {"role": "user", "content": "bye"},
    ]
    assert c.prompt(["R0"]) == "be brief\n\nUser: hi there\n\nAssistant: R0\n\nUser: and then\n\nAssistant:"


def test_multi_turn_shape():
    conversations = MultiTurnWorkload(4, 3, LengthRange(6, 6), LengthRange(4, 4)).conversations(0)
    assert [(c.conversation_id, c.num_turns, c.max_tokens) for c in conversations] == [
        (i, 3, (4, 4, 4)) for i in range(4)]
    assert all(len(t.split()) == 6 for c in conversations for t in c.user_turns)


def test_length_range_parse():
    assert LengthRange.parse("128") == LengthRange(128, 128)
    assert LengthRange.parse("64:256") == LengthRange(64, 256)
    assert str(LengthRange.parse("64:256")) == "64:256"
    for bad in ("0", "9:3", "x"):
        with pytest.raises(ValueError):
            LengthRange.parse(bad)
