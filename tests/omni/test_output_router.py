"""OutputRouter's contract with assembly, while every span is text: each Delta of the Generation
passes through unchanged and in order, finish_reason and usage are the Generation's, and
leaving early aborts the request at once."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import cast

import pytest

from omni.generation import Delta, Generation
from omni.model_pool import ModelPool
from omni.output_router import OutputRouter
from omni.served_model import ServedModel
from omni.tokenizer import TextTokenizer
from scheduler.request import RequestId, RequestStatus, SamplingParams
from tests.omni.fake_pool import FakePool

PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def generation(tokenizer: TextTokenizer, pool: FakePool, stop: tuple[str, ...] = ()) -> Generation:
    model = ServedModel("m", tokenizer, cast(ModelPool, pool), created=0)
    return Generation(model, PROMPT, SamplingParams(max_tokens=16), stop, "req-0")


def record(g: Generation) -> list[Delta]:
    """Make g keep every Delta it yields, to compare with what comes out of the router."""
    seen: list[Delta] = []
    inner = g.deltas

    async def recording() -> AsyncGenerator[Delta, None]:
        async with aclosing(inner()) as deltas:
            async for delta in deltas:
                seen.append(delta)
                yield delta

    g.deltas = recording  # type: ignore[method-assign]
    return seen


async def test_every_delta_passes_through_unchanged_with_finish_reason_and_usage(
    tokenizer: TextTokenizer,
) -> None:
    tokens = tokenizer.encode("Hello there, world", add_special_tokens=False)
    assert len(tokens) >= 3
    g = generation(tokenizer, FakePool(tokens))
    seen = record(g)
    router = OutputRouter(g)

    out = [delta async for delta in router.deltas()]

    assert len(out) == len(seen) == len(tokens)
    assert all(a is b for a, b in zip(out, seen))  # the very objects, in order
    assert [d.token_ids for d in out] == [[t] for t in tokens]
    assert "".join(d.text for d in out) == "Hello there, world"
    assert [d.finish_reason for d in out] == [None] * (len(tokens) - 1) + ["length"]
    assert [[lp.logprob for lp in d.logprobs] for d in out] == [[-0.5]] * len(tokens)
    assert router.usage is g.usage
    assert (router.usage.prompt_tokens, router.usage.completion_tokens) == (len(PROMPT), len(tokens))


async def test_a_stop_string_ends_the_choice_with_stop(tokenizer: TextTokenizer) -> None:
    tokens = tokenizer.encode("Hello there, world", add_special_tokens=False)
    pool = FakePool(tokens)
    g = generation(tokenizer, pool, stop=("there",))
    seen = record(g)

    out = [delta async for delta in OutputRouter(g).deltas()]

    assert out == seen
    assert out[-1].finish_reason == "stop"
    assert "".join(d.text for d in out) == "Hello "
    assert pool.aborted == [(RequestId("req-0"), RequestStatus.FINISHED_STOPPED)]
    assert g.usage.completion_tokens == len(out)


async def test_leaving_early_aborts_the_request_before_anything_else_runs(tokenizer: TextTokenizer) -> None:
    tokens = tokenizer.encode("Hello there, world", add_special_tokens=False)
    pool = FakePool(tokens)
    router = OutputRouter(generation(tokenizer, pool))

    async with aclosing(router.deltas()) as deltas:
        first = await anext(deltas)
    # No await has run since the close: the abort happened in it, not in a later task.
    assert pool.aborted == [(RequestId("req-0"), RequestStatus.FINISHED_ABORTED)]
    assert first.token_ids == tokens[:1]
    assert router.usage.completion_tokens == 1


def test_route_returns_the_delta_itself(tokenizer: TextTokenizer) -> None:
    router = OutputRouter(generation(tokenizer, FakePool([1])))
    delta = Delta("hi", [1, 2], finish_reason="length")
    assert router.route(delta) is delta
