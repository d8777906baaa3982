"""OutputRouter's contract with assembly: each Delta of the Generation passes through in order,
finish_reason and usage are the Generation's, and leaving early aborts the request at once; an
image span is withheld from the text and its codes go to the decoder, the image riding on the
span's last Delta."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from omni.engines.generation import Delta, Generation, OutputOptions
from omni.engines.pool import ModelPool
from omni.errors import APIError
from omni.modalities.outputs.audio import AUDIO, AudioRoute
from omni.modalities.outputs.image import IMAGE, GeneratedImage, ImageRoute, ImageSpan
from omni.modalities.outputs.router import OutputRouter
from omni.text.constrained.audio_span import AudioSpanFormat
from omni.text.constrained.image_span import END, EOF, EOL, VISION_TOKEN, ImageSpanFormat
from omni.text.tokenizer import TextTokenizer
from scheduler.request import RequestId, RequestStatus, SamplingParams
from tests.omni.fake_pool import FakePool

PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def generation(tokenizer: TextTokenizer, pool: FakePool, stop: tuple[str, ...] = ()) -> Generation:
    params = SamplingParams(max_tokens=16)
    return Generation(cast(ModelPool, pool), tokenizer, PROMPT, params, "req-0", output=OutputOptions(stop))


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
    output = OutputOptions(skip_special_tokens=skip_special_tokens)
    g = Generation(cast(ModelPool, pool), tokenizer, PROMPT, SamplingParams(max_tokens=64), "req-0", output=output)
    decoder = FakeDecoder()
    out = [d async for d in OutputRouter(g, ImageRoute(fmt, decoder)).deltas()]
    assert len(out) == len(pool.tokens)  # one Delta out per Delta in
    assert "".join(d.text for d in out) == "Here: done"
    assert [s.ratio for s in decoder.spans] == [(16, 9), (1, 1)]
    assert [s.codes for s in decoder.spans] == [(1, 2, 3, 4, 5, 6), (0, 0, 63, 63, 7, 8)]
    with_images = [i for i, d in enumerate(out) if IMAGE.pieces(d)]
    assert with_images == [len(before) + len(first) - 1, len(pool.tokens) - 1]  # on each span's last token
    assert out[-1].finish_reason == "stop" and [i.url for d in out for i in IMAGE.pieces(d)] == ["https://img/1", "https://img/2"]


async def test_a_span_cut_short_gives_no_image(tokenizer: TextTokenizer) -> None:
    fmt = ImageSpanFormat.from_tokenizer(tokenizer, rows=2, cols=3)
    assert fmt is not None
    span = image_tokens(tokenizer, fmt, "<|vision_ratio_4:3|>", [1, 2, 3, 4, 5, 6])
    pool = FakePool(span[:-3], finish_reason="length")  # max_tokens ends it inside the codes
    decoder = FakeDecoder()
    g = Generation(cast(ModelPool, pool), tokenizer, PROMPT, SamplingParams(max_tokens=64), "req-0", output=OutputOptions())
    out = [d async for d in OutputRouter(g, ImageRoute(fmt, decoder)).deltas()]
    assert decoder.spans == [] and not any(IMAGE.pieces(d) for d in out)
    assert out[-1].finish_reason == "length" and "".join(d.text for d in out) == ""


class FakeSink:
    """Records the chunks it is sent; each unit decodes to 2 samples (its value, twice)."""

    def __init__(self, log: list[tuple[list[int], bool]]) -> None:
        self.log = log
        self.closed = False

    async def decode(self, units: list[int], *, last: bool = False) -> bytes:
        self.log.append((list(units), last))
        return np.repeat(np.asarray(units, dtype="<f4"), 2).tobytes()

    def close(self) -> None:
        self.closed = True


def audio_route(tokenizer: TextTokenizer, sinks: list[FakeSink], log: list[tuple[list[int], bool]], **kw: object) -> AudioRoute:
    fmt = AudioSpanFormat.from_tokenizer(tokenizer)
    assert fmt is not None

    def open_stream() -> FakeSink:
        sinks.append(FakeSink(log))
        return sinks[-1]

    return AudioRoute(fmt, open_stream, 24000, first_chunk_units=1, chunk_units=8, **kw)  # type: ignore[arg-type]


async def test_audio_units_go_to_the_vocoder_in_chunks_and_never_into_the_text(tokenizer: TextTokenizer) -> None:
    sinks: list[FakeSink] = []
    log: list[tuple[list[int], bool]] = []
    route = audio_route(tokenizer, sinks, log)
    fmt = route.format
    unit = [fmt.first_unit_id + u for u in range(12)]
    said = tokenizer.encode("Sure:", add_special_tokens=False)
    tokens = [*said, fmt.start_token_id, *unit, fmt.end_token_id, *said, fmt.start_token_id, *unit[:4], fmt.end_token_id]
    g = generation(tokenizer, FakePool(tokens))
    g.params = SamplingParams(max_tokens=len(tokens))
    out = [delta async for delta in OutputRouter(g, route).deltas()]
    assert "".join(d.text for d in out) == "Sure:Sure:"
    # the first chunk waits for the span's least units (3, though 1 was asked), the next is twice
    # that (up to 8), the rest at the end; a second span starts over
    assert log == [([0, 1, 2], False), ([3, 4, 5, 6, 7, 8], False), ([9, 10, 11], True), ([0, 1, 2], False), ([3], True)]
    pieces = [p for d in out for p in AUDIO.pieces(d)]
    assert [(p.span, p.last) for p in pieces] == [(0, False), (0, False), (0, True), (1, False), (1, True)]
    first = np.concatenate([np.frombuffer(p.samples, dtype="<f4") for p in pieces if p.span == 0])
    assert first.tolist() == np.repeat(np.arange(12, dtype="<f4"), 2).tolist()
    # a piece rides on the Delta whose token completed its chunk
    carrying = [i for i, d in enumerate(out) if AUDIO.pieces(d)]
    assert carrying[0] == len(said) + 3 and len(sinks) == 2 and not any(s.closed for s in sinks)


@pytest.mark.parametrize(("units", "audio"), [(4, True), (2, False)])
async def test_a_span_cut_by_max_tokens_keeps_its_audio_when_it_has_three_units(
    tokenizer: TextTokenizer, units: int, audio: bool
) -> None:
    sinks: list[FakeSink] = []
    log: list[tuple[list[int], bool]] = []
    route = audio_route(tokenizer, sinks, log, opened=True)  # the prompt opened the span
    tokens = [route.format.first_unit_id + u for u in range(units)]
    g = generation(tokenizer, FakePool(tokens))
    g.params = SamplingParams(max_tokens=units)
    out = [delta async for delta in OutputRouter(g, route).deltas()]
    assert out[-1].finish_reason == "length"
    pieces = [p for d in out for p in AUDIO.pieces(d)]
    if audio:
        assert log[-1][1] and sum(len(u) for u, _ in log) == units and pieces[-1].last
    else:
        assert pieces == [] and sinks[0].closed


async def test_leaving_mid_span_closes_the_vocoder_stream(tokenizer: TextTokenizer) -> None:
    sinks: list[FakeSink] = []
    log: list[tuple[list[int], bool]] = []
    route = audio_route(tokenizer, sinks, log)
    fmt = route.format
    tokens = [fmt.start_token_id, *(fmt.first_unit_id + u for u in range(6)), fmt.end_token_id]
    g = generation(tokenizer, FakePool(tokens))
    async with aclosing(OutputRouter(g, route).deltas()) as deltas:
        async for delta in deltas:
            if AUDIO.pieces(delta):
                break
    assert sinks[0].closed


@dataclass
class Bracket:
    """A made-up span kind, routed by the unchanged router: from open_id to close_id, the
    tokens between ride on the closing Delta."""

    open_id: int
    close_id: int
    opened: bool = False
    inside: list[int] = field(default_factory=list)
    spans: list[str] = field(default_factory=list)

    def opens(self, token_id: int) -> bool:
        return token_id == self.open_id

    def open(self, generation: Generation) -> None:
        self.inside = []

    async def feed(self, delta: Delta, token_id: int) -> bool:
        if token_id != self.close_id:
            self.inside.append(token_id)
            return False
        IMAGE.add(delta, GeneratedImage(f"bracket:{self.inside}", 0, 0))
        return True

    async def end(self, delta: Delta, *, cut: bool) -> None:
        self.spans.append("cut")

    def close(self) -> None:
        self.spans.append("closed")

    def after(self, generation: Generation) -> Generation | None:
        return None

    def missing(self) -> APIError | None:
        return None


async def test_a_new_span_kind_is_a_route_class_and_the_router_is_unchanged(tokenizer: TextTokenizer) -> None:
    tokens = list(range(100, 106))
    bracket = Bracket(tokens[1], tokens[4])
    g = generation(tokenizer, FakePool(tokens))
    out = [d async for d in OutputRouter(g, None, bracket).deltas()]
    assert len(out) == len(tokens)
    assert [(i, img.url) for i, d in enumerate(out) for img in IMAGE.pieces(d)] == [(4, f"bracket:{tokens[2:4]}")]
    assert bracket.spans == []  # ended by its own token: neither cut nor closed


@pytest.mark.parametrize(("text_finish", "finish"), [("stop", "stop"), ("length", "length")])
async def test_a_text_cut_at_its_share_is_still_spoken_and_the_choice_ends_length(
    tokenizer: TextTokenizer, text_finish: str, finish: str
) -> None:
    """A spoken turn's text that ran to its share of max_tokens goes on to its speech as one that
    ended does; the choice then ends "length" (the answer was cut) though the span closed."""
    sinks: list[FakeSink] = []
    log: list[tuple[list[int], bool]] = []
    route = audio_route(tokenizer, sinks, log)
    fmt = route.format
    speech = generation(tokenizer, FakePool([fmt.first_unit_id + u for u in range(4)] + [fmt.end_token_id], finish_reason="stop"))
    route.speak_after = lambda g: speech
    said = tokenizer.encode("Sure", add_special_tokens=False)
    g = generation(tokenizer, FakePool(said, finish_reason=text_finish))
    out = [delta async for delta in OutputRouter(g, route).deltas()]
    assert [d.finish_reason for d in out if d.finish_reason is not None] == [finish]
    assert sum(len(u) for u, _ in log) == 4 and log[-1][1]
