"""Generation on its own: one choice through a real one-worker ModelPool whose worker is a
FakeLLMWorker (tests/omni/engines/fake_worker.py) reading a script, detokenized with the tiny
tokenizer. What a choice's text, offsets, stop, usage and abort come to, exactly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from pathlib import Path

import pytest

from omni.config import LLMConfig, ModelConfig
from omni.engines.generation import (
    Delta,
    Generation,
    OutputOptions,
    PromptLogprob,
    Usage,
    choice_params,
    prompt_logprobs,
    response_id,
)
from omni.engines.pool import ModelPool
from omni.metrics import Metrics
from omni.shared import protocol
from omni.text.tokenizer import TextTokenizer
from scheduler.request import RequestId, SamplingParams
from tests.omni.engines.fake_worker import FakeLLMWorker

GUARD_S = 120.0  # a hung engine fails the test instead of hanging it
PROMPT = [5, 6, 7]
HELLO = [1256, 964, 11, 288, 286, 692]  # "Hello there, world" in the tiny tokenizer
EOS = 1282


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    assert tokenizer.encode("Hello there, world", add_special_tokens=False) == HELLO
    assert tokenizer.eos_token_ids == {EOS}
    return tokenizer


class Script:
    """The worker's next token: the script's, then EOS."""

    def __init__(self, tokens: Sequence[int] = HELLO) -> None:
        self.tokens = list(tokens)

    def __call__(self, so_far: list[int]) -> int:
        i = len(so_far) - len(PROMPT)
        return self.tokens[i] if i < len(self.tokens) else EOS


@pytest.fixture
async def served() -> AsyncIterator[tuple[ModelPool, FakeLLMWorker]]:
    config = ModelConfig(name="m", model_dir=Path("."), llm=LLMConfig(block_size=4, max_num_seqs=2))
    pool = ModelPool(config, Metrics())
    (engine,) = pool.engines
    worker = FakeLLMWorker(engine.spec, engine.wake, next_token=Script())  # type: ignore[arg-type]
    engine.worker = worker  # type: ignore[assignment]
    await pool.start()
    yield pool, worker
    await pool.stop()


def generation(
    pool: ModelPool, tokenizer: TextTokenizer, max_tokens: int = 16, name: str = "g", prompt: Sequence[int] = PROMPT, **output: object
) -> Generation:
    params = SamplingParams(max_tokens=max_tokens, **output.pop("params", {}))  # type: ignore[arg-type]
    return Generation(pool, tokenizer, list(prompt), params, name, output=OutputOptions(**output))  # type: ignore[arg-type]


async def deltas(g: Generation) -> list[Delta]:
    async def drain() -> list[Delta]:
        return [d async for d in g.deltas()]

    return await asyncio.wait_for(drain(), GUARD_S)


def in_engine(pool: ModelPool, request_id: str) -> bool:
    scheduler = pool.engines[0].scheduler
    assert scheduler is not None
    return scheduler.get_request(RequestId(request_id)) is not None


async def test_each_token_is_a_delta_with_its_text_and_offset(served: tuple[ModelPool, FakeLLMWorker], tokenizer: TextTokenizer) -> None:
    pool, _ = served
    g = generation(pool, tokenizer, max_tokens=4)
    out = await deltas(g)
    assert [(d.text, d.token_ids, d.finish_reason) for d in out] == [
        ("Hello", [1256], None), (" there", [964], None), (",", [11], None), (" w", [288], "length"),
    ]  # fmt: skip
    assert [d.text_offsets for d in out] == [[0], [5], [11], [12]]
    assert all(d.stop_reason is None and d.logprobs == [] for d in out)
    assert (g.usage.prompt_tokens, g.usage.completion_tokens, g.usage.cached_tokens) == (3, 4, 0)
    assert g.first_token_time is not None


async def test_eos_ends_the_choice_adding_no_text(served: tuple[ModelPool, FakeLLMWorker], tokenizer: TextTokenizer) -> None:
    pool, _ = served
    g = generation(pool, tokenizer)
    out = await deltas(g)
    assert "".join(d.text for d in out) == "Hello there, world"
    assert (out[-1].text, out[-1].token_ids, out[-1].finish_reason, out[-1].stop_reason) == ("", [EOS], "stop", None)
    assert g.usage.completion_tokens == 7  # the EOS counts, as vLLM counts it


async def test_a_clients_stop_token_is_the_stop_reason(served: tuple[ModelPool, FakeLLMWorker], tokenizer: TextTokenizer) -> None:
    pool, _ = served
    g = generation(pool, tokenizer, params={"stop_token_ids": (11,)}, stop_token_ids=(11,))
    out = await deltas(g)
    assert "".join(d.text for d in out) == "Hello there"
    assert (out[-1].finish_reason, out[-1].stop_reason) == ("stop", 11)
    shown = generation(pool, tokenizer, name="h", params={"stop_token_ids": (11,)}, stop_token_ids=(11,), include_stop_str_in_output=True)
    assert "".join(d.text for d in await deltas(shown)) == "Hello there,"


async def test_a_stop_string_ends_the_choice_and_frees_the_request(
    served: tuple[ModelPool, FakeLLMWorker], tokenizer: TextTokenizer
) -> None:
    pool, _ = served
    g = generation(pool, tokenizer, stop=(", w",))
    out = await deltas(g)
    assert "".join(d.text for d in out) == "Hello there"
    assert (out[-1].token_ids, out[-1].finish_reason, out[-1].stop_reason) == ([288], "stop", ", w")
    assert g.usage.completion_tokens == 4
    assert not in_engine(pool, "g")  # aborted as the stop string was seen, not run to the end
    with_stop = generation(pool, tokenizer, name="h", stop=(", w",), include_stop_str_in_output=True)
    assert "".join(d.text for d in await deltas(with_stop)) == "Hello there, w"


async def test_leaving_early_aborts_the_request_in_the_engine(
    served: tuple[ModelPool, FakeLLMWorker], tokenizer: TextTokenizer
) -> None:
    pool, worker = served
    worker.gate, worker.one_step_a_gate = asyncio.Event(), True
    worker.gate.set()  # one step: the first token, then the second step waits
    g = generation(pool, tokenizer)
    async with aclosing(g.deltas()) as stream:
        first = await asyncio.wait_for(anext(stream), GUARD_S)
        assert first.text == "Hello" and in_engine(pool, "g")
    assert not in_engine(pool, "g")  # gone before any further step
    worker.one_step_a_gate = False
    worker.gate.set()  # the step in flight answers (its token for g dropped), and what follows
    # the worker is told with the next step it gets
    assert [d.text for d in await deltas(generation(pool, tokenizer, max_tokens=1, name="next"))] == ["Hello"]
    assert "g" in worker.steps[-1].finished_request_ids


async def test_a_cancelled_consumer_aborts_the_request(served: tuple[ModelPool, FakeLLMWorker], tokenizer: TextTokenizer) -> None:
    pool, worker = served
    worker.gate = asyncio.Event()  # the first step never answers
    g = generation(pool, tokenizer)
    task = asyncio.create_task(deltas(g))
    await worker.wait_for_steps(1)
    assert in_engine(pool, "g")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not in_engine(pool, "g")


async def test_logprobs_ride_on_their_delta(served: tuple[ModelPool, FakeLLMWorker], tokenizer: TextTokenizer) -> None:
    pool, _ = served
    (delta,) = await deltas(generation(pool, tokenizer, max_tokens=1, params={"logprobs": 1}))
    ((token_id, logprob, top),) = [(lp.token_id, lp.logprob, lp.top) for lp in delta.logprobs]
    assert (token_id, logprob, top) == (1256, -0.25, [(1256, -0.25)])


async def test_a_repeated_prompt_reports_its_cached_tokens(served: tuple[ModelPool, FakeLLMWorker], tokenizer: TextTokenizer) -> None:
    pool, _ = served
    prompt = list(range(20, 29))  # two full blocks of 4
    first = generation(pool, tokenizer, max_tokens=1, prompt=prompt)
    await deltas(first)
    again = generation(pool, tokenizer, max_tokens=1, name="again", prompt=prompt)
    await deltas(again)
    assert (first.usage.cached_tokens, again.usage.cached_tokens) == (0, 8)


async def test_a_prefill_only_choice_without_prompt_logprobs_never_reaches_the_engine(
    served: tuple[ModelPool, FakeLLMWorker], tokenizer: TextTokenizer
) -> None:
    pool, worker = served
    out = await deltas(generation(pool, tokenizer, max_tokens=0))
    assert [(d.text, d.token_ids, d.finish_reason) for d in out] == [("", [], "length")]
    assert worker.steps == []


def test_prompt_logprobs_join_the_workers_parts_by_position() -> None:
    parts = [
        protocol.PromptLogprobs("r", 1, [-1.0, -2.0], [1, 3], [[8, 9], [8, 7]], [[-1.0, -1.5], [-0.5, -1.0]]),
        protocol.PromptLogprobs("r", 3, [-0.5], [2], [[4, 6]], [[-0.25, -0.5]]),
    ]
    assert prompt_logprobs([10, 8, 9, 6], parts) == [
        None,
        PromptLogprob(8, -1.0, 1, [(8, -1.0), (9, -1.5)]),
        PromptLogprob(9, -2.0, 3, [(8, -0.5), (7, -1.0)]),
        PromptLogprob(6, -0.5, 2, [(4, -0.25), (6, -0.5)]),
    ]
    with pytest.raises(RuntimeError, match="from 3, expected 1"):
        prompt_logprobs([10, 8, 9, 6], parts[1:])
    with pytest.raises(RuntimeError, match="for 3 of 4 tokens"):
        prompt_logprobs([10, 8, 9, 6], parts[:1])


def test_the_choices_of_a_seeded_request_get_seeds_in_a_row() -> None:
    seeded = SamplingParams(max_tokens=4, seed=40)
    assert [choice_params(seeded, i).seed for i in range(3)] == [40, 41, 42]
    assert choice_params(seeded, 0) is seeded
    unseeded = SamplingParams(max_tokens=4)
    assert choice_params(unseeded, 2) is unseeded


def test_a_client_named_request_names_its_response() -> None:
    assert response_id("chatcmpl", None, "chatcmpl-abc") == "chatcmpl-abc"
    assert response_id("chatcmpl", "mine", "chatcmpl-abc") == "chatcmpl-mine"


def test_usage_adds_up_field_by_field() -> None:
    total = Usage(3, 4, 1)
    total.add(Usage(10, 20, 8))
    assert total == Usage(13, 24, 9)
