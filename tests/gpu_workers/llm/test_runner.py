from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpu_workers.llm.runner import CPU_KV_CACHE_BYTES, LLMRunner, kv_bytes_per_block
from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from omni.shared import protocol
from tests.gpu_workers.conftest import StepDriver

GREEDY = protocol.SamplingOptions(temperature=0.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "hyperclovax")


def make_runner(model_dir: Path, **kwargs: object) -> LLMRunner:
    options: dict[str, object] = {"block_size": 4, "num_kv_blocks": 32} | kwargs
    return LLMRunner(model_dir, **options)  # type: ignore[arg-type]


def new(request_id: str, tokens: list[int], blocks: list[int], n: int | None = None,
        sampling: protocol.SamplingOptions = GREEDY) -> protocol.NewRequest:  # fmt: skip
    return protocol.NewRequest(request_id, tokens, sampling, blocks, 0, len(tokens) if n is None else n)


def test_sizes(tiny: Path) -> None:
    r = make_runner(tiny)
    assert (r.num_kv_blocks, r.block_size, r.max_model_len) == (32, 4, 8192)
    per_block = kv_bytes_per_block(r.model_config, 4, torch.float32)
    assert per_block == 2 * 2 * 4 * 2 * 16 * 4
    r = make_runner(tiny, num_kv_blocks=None, kv_cache_memory_bytes=10 * per_block + 5, max_model_len=100)
    assert (r.num_kv_blocks, r.max_model_len) == (10, 100)
    assert r.kv_cache.shape == (2, 2, 10, 4, 2, 16)
    with pytest.raises(ValueError, match="max_model_len"):
        make_runner(tiny, max_model_len=10**6)
    # Neither size given: the CPU default budget decides.
    r = make_runner(tiny, num_kv_blocks=None, max_model_len=100)
    assert r.num_kv_blocks == CPU_KV_CACHE_BYTES // per_block
    with pytest.raises(ValueError, match="unknown attention backend"):
        make_runner(tiny, attention_backend="nope")
    with pytest.raises(ValueError, match="'flash_attn' cannot take this KV cache: block_size 4 .*float32.*device cpu"):
        make_runner(tiny, attention_backend="flash_attn")


def test_invalid_steps_raise_and_change_nothing(tiny: Path) -> None:
    r = make_runner(tiny)
    r.execute(protocol.Step(0, [new("a", [1, 2, 3, 4], [5])], [], []))  # 5 tokens once it samples
    snapshot = (list(r.requests["a"].token_ids), list(r.requests["a"].block_ids))
    bad_steps = {
        "unknown": protocol.Step(1, [new("b", [4], [6])], [protocol.CachedRequest("zz", [], 0, 1)], []),
        "blocks of 4 cannot hold": protocol.Step(1, [], [protocol.CachedRequest("a", [], 4, 1)], []),
        "cannot compute tokens": protocol.Step(1, [], [protocol.CachedRequest("a", [7], 4, 2)], []),
        "already known": protocol.Step(1, [new("a", [1], [7])], [], []),
        "block ids must be in": protocol.Step(1, [new("c", [1], [32])], [], []),
        "token ids must be": protocol.Step(1, [new("c", [10**6], [8])], [], []),
        "top_p": protocol.Step(1, [new("c", [1], [8], sampling=protocol.SamplingOptions(top_p=0.0))], [], []),
    }
    for message, step in bad_steps.items():
        with pytest.raises(ValueError, match=message):
            r.execute(step)
        assert set(r.requests) == {"a"}
        assert (r.requests["a"].token_ids, r.requests["a"].block_ids) == snapshot
    # and the request carries on afterwards
    out = r.execute(protocol.Step(2, [], [protocol.CachedRequest("a", [7], 4, 1)], []))
    assert [s.request_id for s in out.sampled] == ["a"]
    r.execute(protocol.Step(3, [], [], ["a", "never-seen"]))
    assert not r.requests


def test_preempted_request_resumes_with_the_same_tokens(tiny: Path) -> None:
    prompt = [11, 12, 13, 14, 15, 16]
    expected = StepDriver(make_runner(tiny)).run([prompt], 6)[0]
    r = make_runner(tiny)
    tokens = list(prompt)
    r.execute(protocol.Step(0, [new("a", prompt, [0, 1])], [], []))
    tokens.append(r.requests["a"].token_ids[-1])
    r.execute(protocol.Step(1, [], [protocol.CachedRequest("a", [], 6, 1)], []))
    tokens.append(r.requests["a"].token_ids[-1])
    # preempted: blocks gone (and overwritten by someone else); recompute all 8 into new blocks
    r.kv_cache.normal_()
    r.execute(protocol.Step(2, [], [protocol.CachedRequest("a", [9, 3], 0, 8, resumed=True)], []))
    for i in range(3):
        r.execute(protocol.Step(3 + i, [], [protocol.CachedRequest("a", [20] if i == 0 else [], 9 + i - 1, 1)], []))
    assert r.requests["a"].token_ids[len(prompt) :] == expected


def test_seeded_requests_reproduce_whatever_shares_the_batch(tiny: Path) -> None:
    seeded = protocol.SamplingOptions(temperature=1.0, seed=1234, logprobs=2)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    alone = StepDriver(make_runner(tiny)).run([prompts[0]], 8, sampling=[seeded])[0]
    sched = StepDriver(make_runner(tiny), chunk=2)
    others = [protocol.SamplingOptions(temperature=1.0), protocol.SamplingOptions(temperature=0.7, top_p=0.9)]
    mixed = sched.run(prompts, 8, sampling=[seeded, *others], join_at=[1, 0, 2])[0]
    assert alone == mixed
    first = next(s for res in sched.results for s in res.sampled if s.request_id == "r0")
    assert first.logprob is not None and first.logprob < 0
    assert first.top_logprobs is not None and len(first.top_logprobs) == 2
    assert first.top_logprobs[0].logprob >= first.top_logprobs[1].logprob  # best first


def test_prefix_cache_hit_reads_another_requests_blocks(tiny: Path) -> None:
    shared, tail = [21, 22, 23, 24, 25, 26, 27, 28], [29, 30, 31]
    expected = StepDriver(make_runner(tiny)).run([shared + tail], 4)[0]
    r = make_runner(tiny)
    r.execute(protocol.Step(0, [new("a", shared, [7, 3])], [], []))
    # b's first two blocks are a's: its KV for positions [0, 8) is already there
    b = protocol.NewRequest("b", shared + tail, GREEDY, [7, 3, 12], 8, 3)
    out = [r.execute(protocol.Step(1, [b], [], ["a"])).sampled[0].token_id]
    blocks = [[], [5], []]
    for i in range(3):
        step = protocol.Step(2 + i, [], [protocol.CachedRequest("b", blocks[i], 11 + i, 1)], [])
        out.append(r.execute(step).sampled[0].token_id)
    assert out == expected
