"""OutputRouter's contract with assembly: each Delta of the Generation passes through in order,
finish_reason and usage are the Generation's, and leaving early aborts the request at once; an
image span is withheld from the text and its codes go to the decoder, the image riding on the
span's last Delta."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import cast

import pytest

from omni.constrained.image_span import END, EOF, EOL, VISION_TOKEN, ImageSpanFormat
from omni.generation import Delta, GeneratedImage, Generation
from omni.model_pool import ModelPool
from omni.output_router import ImageRoute, ImageSpan, OutputRouter
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


async def test_route_returns_the_delta_itself(tokenizer: TextTokenizer) -> None:
    router = OutputRouter(generation(tokenizer, FakePool([1])))
    delta = Delta("hi", [1, 2], finish_reason="length")
    assert await router.route(delta) is delta


class FakeDecoder:
    def __init__(self) -> None:
        self.spans: list[ImageSpan] = []

    async def decode(self, span: ImageSpan, request_id: str) -> GeneratedImage:
        self.spans.append(span)
        return GeneratedImage(f"https://img/{len(self.spans)}", 768, 768)


def image_tokens(tokenizer: TextTokenizer, fmt: ImageSpanFormat, ratio: str, codes: list[int]) -> list[int]:
    ids = [fmt.start_token_id, tokenizer.token_to_id(ratio), tokenizer.token_to_id(VISION_TOKEN)]
    for r in range(fmt.rows):
        ids += [fmt.first_code_id + c for c in codes[r * fmt.cols : (r + 1) * fmt.cols]]
        ids.append(tokenizer.token_to_id(EOL))
    return ids + [tokenizer.token_to_id(EOF), tokenizer.token_to_id(END)]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
async def test_image_spans_go_to_the_decoder_and_never_into_the_text(tokenizer: TextTokenizer, skip_special_tokens: bool) -> None:
    fmt = ImageSpanFormat.from_tokenizer(tokenizer, rows=2, cols=3)
    assert fmt is not None
    before = tokenizer.encode("Here:", add_special_tokens=False)
    after = tokenizer.encode(" done", add_special_tokens=False)
    first = image_tokens(tokenizer, fmt, "<|vision_ratio_16:9|>", [1, 2, 3, 4, 5, 6])
    second = image_tokens(tokenizer, fmt, "<|vision_ratio_1:1|>", [0, 0, 63, 63, 7, 8])
    pool = FakePool(before + first + after + second, finish_reason="stop")
    model = ServedModel("m", tokenizer, cast(ModelPool, pool), created=0)
    g = Generation(model, PROMPT, SamplingParams(max_tokens=64), (), "req-0", skip_special_tokens)
    decoder = FakeDecoder()
    out = [d async for d in OutputRouter(g, ImageRoute(fmt, decoder)).deltas()]
    assert len(out) == len(pool.tokens)  # one Delta out per Delta in
    assert "".join(d.text for d in out) == "Here: done"
    assert [s.ratio for s in decoder.spans] == [(16, 9), (1, 1)]
    assert [s.codes for s in decoder.spans] == [(1, 2, 3, 4, 5, 6), (0, 0, 63, 63, 7, 8)]
    with_images = [i for i, d in enumerate(out) if d.images]
    assert with_images == [len(before) + len(first) - 1, len(pool.tokens) - 1]  # on each span's last token
    assert out[-1].finish_reason == "stop" and [i.url for d in out for i in d.images] == ["https://img/1", "https://img/2"]


async def test_a_span_cut_short_gives_no_image(tokenizer: TextTokenizer) -> None:
    fmt = ImageSpanFormat.from_tokenizer(tokenizer, rows=2, cols=3)
    assert fmt is not None
    span = image_tokens(tokenizer, fmt, "<|vision_ratio_4:3|>", [1, 2, 3, 4, 5, 6])
    pool = FakePool(span[:-3], finish_reason="length")  # max_tokens ends it inside the codes
    model = ServedModel("m", tokenizer, cast(ModelPool, pool), created=0)
    decoder = FakeDecoder()
    g = Generation(model, PROMPT, SamplingParams(max_tokens=64), (), "req-0")
    out = [d async for d in OutputRouter(g, ImageRoute(fmt, decoder)).deltas()]
    assert decoder.spans == [] and not any(d.images for d in out)
    assert out[-1].finish_reason == "length" and "".join(d.text for d in out) == ""
