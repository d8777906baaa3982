"""Completions assembly over a scripted pool: choices prompt-major, echo (and its logprobs),
prompt_logprobs, max_tokens 0, text offsets where special tokens occur, token ids as names,
continuous usage, request_id."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.engines.generation import PromptLogprob, prompt_logprobs
from omni.engines.llm import PrefillDone
from omni.engines.pool import ModelPool
from omni.http.errors import error_middleware
from omni.http.handlers import completions
from omni.http.state import MODELS
from omni.serving.model import ModelRegistry, ServedModel
from omni.shared import protocol
from omni.text.tokenizer import TextTokenizer
from scheduler.request import Request
from tests.omni.fake_pool import FakePool, FakeStream

PROMPT = "Hello there"


def prompt_parts(request: Request) -> list[protocol.PromptLogprobs]:
    """A worker's answer in two chunks: token q's logprob is -q/10, its rank q, and its top
    alternatives are ids 7, 8, ... with logprobs -0.01, -0.02, ..."""
    params = request.sampling_params
    if params.prompt_logprobs is None:
        return []
    k, n = params.prompt_logprobs, len(request.prompt_token_ids)
    parts = []
    for lo, hi in ((1, min(3, n)), (min(3, n), n)):
        if lo < hi:
            positions = range(lo, hi)
            parts.append(
                protocol.PromptLogprobs(
                    request.request_id, lo, [-q / 10 for q in positions], list(positions),
                    [[7 + j for j in range(k)] for _ in positions],
                    [[-(j + 1) / 100 for j in range(k)] for _ in positions],
                )
            )  # fmt: skip
    return parts


@dataclass(slots=True)
class ScriptedStream(FakeStream):
    prompt_logprobs: list[protocol.PromptLogprobs] = field(default_factory=list)


@dataclass
class ScriptedPool(FakePool):
    """FakePool, plus the worker's prompt logprobs and prefill-only requests."""

    def submit(self, request: Request, constraint: object = None) -> ScriptedStream:
        plain = FakePool.submit(self, request, constraint)
        events: list[Any] = [PrefillDone()] if request.sampling_params.prefill_only else plain.events
        return ScriptedStream(request, events, prompt_parts(request))


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.fixture
def im_end(tokenizer: TextTokenizer) -> int:
    token_id = tokenizer.token_to_id("<|im_end|>")
    assert token_id is not None
    return token_id


@pytest.fixture
def pool(tokenizer: TextTokenizer, im_end: int) -> ScriptedPool:
    # "H" "i", a special token, " there", the special again
    ids = tokenizer.encode("Hi", add_special_tokens=False) + [im_end]
    return ScriptedPool([*ids, *tokenizer.encode(" there", add_special_tokens=False), im_end])


def _app(tokenizer: TextTokenizer, pool: FakePool) -> web.Application:
    app = web.Application(middlewares=[error_middleware])
    app[MODELS] = ModelRegistry()
    app[MODELS].add(ServedModel("m", tokenizer, cast(ModelPool, pool), created=0))
    app.router.add_post("/v1/completions", completions.create_completion)
    return app


@pytest.fixture
async def client(tokenizer: TextTokenizer, pool: ScriptedPool) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(_app(tokenizer, pool))) as c:
        yield c


async def post(client: TestClient[Any, Any], **fields: Any) -> dict[str, Any]:
    r = await client.post("/v1/completions", json={"model": "m", "prompt": PROMPT, **fields})
    body = await r.json()
    assert r.status == 200, body
    return cast(dict[str, Any], body)


async def chunks(client: TestClient[Any, Any], **fields: Any) -> list[dict[str, Any]]:
    r = await client.post("/v1/completions", json={"model": "m", "prompt": PROMPT, "stream": True, **fields})
    assert r.status == 200
    events = [e.removeprefix("data: ") for e in (await r.text()).split("\n\n") if e]
    assert events[-1] == "[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


def pieces(text: str, offsets: list[int]) -> list[str]:
    return [text[a:b] for a, b in zip(offsets, [*offsets[1:], len(text)])]


@pytest.mark.parametrize("skip", [True, False])
async def test_text_offsets_index_the_text_returned(
    client: TestClient[Any, Any], pool: ScriptedPool, tokenizer: TextTokenizer, skip: bool
) -> None:
    body = await post(client, logprobs=0, skip_special_tokens=skip)
    choice = body["choices"][0]
    assert choice["text"] == ("Hi there" if skip else "Hi<|im_end|> there<|im_end|>")
    lp = choice["logprobs"]
    assert pieces(choice["text"], lp["text_offset"]) == [tokenizer.decode([t], skip_special_tokens=skip) for t in pool.tokens]
    assert lp["tokens"][2] == "<|im_end|>"  # a token is named by its text, shown or not
    # streamed: the same offsets, chunk by chunk
    streamed = await chunks(client, logprobs=0, skip_special_tokens=skip)
    assert "".join(c["choices"][0]["text"] for c in streamed) == choice["text"]
    assert [o for c in streamed for o in c["choices"][0]["logprobs"]["text_offset"]] == lp["text_offset"]


async def test_top_logprobs_name_the_token_first_then_its_alternatives(client: TestClient[Any, Any]) -> None:
    lp = (await post(client, logprobs=0))["choices"][0]["logprobs"]
    # logprobs=0: the token alone (the scripted pool gives every token -0.5 and no alternatives)
    assert lp["top_logprobs"] == [{t: -0.5} for t in lp["tokens"]]


async def test_tokens_as_token_ids(client: TestClient[Any, Any], pool: ScriptedPool) -> None:
    lp = (await post(client, logprobs=0, return_tokens_as_token_ids=True))["choices"][0]["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in pool.tokens]
    assert [list(top) for top in lp["top_logprobs"]] == [[f"token_id:{t}"] for t in pool.tokens]


async def test_echo_prepends_the_prompt_and_its_logprobs(
    client: TestClient[Any, Any], pool: ScriptedPool, tokenizer: TextTokenizer
) -> None:
    prompt_ids = tokenizer.encode(PROMPT)
    body = await post(client, echo=True, logprobs=1, skip_special_tokens=False)
    choice = body["choices"][0]
    assert choice["text"] == PROMPT + "Hi<|im_end|> there<|im_end|>"
    lp = choice["logprobs"]
    ids = prompt_ids + pool.tokens
    assert lp["tokens"] == [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    assert lp["token_logprobs"][: len(prompt_ids)] == [None] + [-q / 10 for q in range(1, len(prompt_ids))]
    assert lp["token_logprobs"][len(prompt_ids) :] == [-0.5] * len(pool.tokens)
    assert lp["top_logprobs"][0] is None
    assert lp["top_logprobs"][1] == {lp["tokens"][1]: -0.1, tokenizer.decode([7]): -0.01}
    assert pieces(choice["text"], lp["text_offset"]) == lp["tokens"]
    assert "prompt_logprobs" not in choice  # not asked for: echo uses them internally
    assert body["usage"]["completion_tokens"] == len(pool.tokens)
    # streamed: the prompt rides on the first chunk
    streamed = await chunks(client, echo=True, logprobs=1, skip_special_tokens=False)
    first = streamed[0]["choices"][0]
    assert first["text"].startswith(PROMPT) and first["logprobs"]["token_logprobs"][0] is None
    assert "".join(c["choices"][0]["text"] for c in streamed) == choice["text"]
    assert [o for c in streamed for o in c["choices"][0]["logprobs"]["text_offset"]] == lp["text_offset"]


async def test_echo_of_token_ids_decodes_them(client: TestClient[Any, Any], tokenizer: TextTokenizer, im_end: int) -> None:
    ids = [*tokenizer.encode("Hi", add_special_tokens=False), im_end]
    assert (await post(client, prompt=ids, echo=True))["choices"][0]["text"].startswith("Hi" + "Hi")
    shown = await post(client, prompt=ids, echo=True, skip_special_tokens=False)
    assert shown["choices"][0]["text"].startswith("Hi<|im_end|>Hi")


async def test_echo_with_max_tokens_zero_scores_the_prompt_alone(
    client: TestClient[Any, Any], pool: ScriptedPool, tokenizer: TextTokenizer
) -> None:
    prompt_ids = tokenizer.encode(PROMPT)
    body = await post(client, echo=True, max_tokens=0, logprobs=0)
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (PROMPT, "length")
    assert choice["logprobs"]["token_logprobs"] == [None] + [-q / 10 for q in range(1, len(prompt_ids))]
    assert pieces(PROMPT, choice["logprobs"]["text_offset"]) == [tokenizer.decode([t]) for t in prompt_ids]
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (len(prompt_ids), 0)
    assert pool.submitted[-1].sampling_params.prefill_only
    # without logprobs nothing needs computing: the engine is not asked at all
    submitted = len(pool.submitted)
    plain = await post(client, echo=True, max_tokens=0)
    assert plain["choices"][0]["text"] == PROMPT and len(pool.submitted) == submitted
    streamed = await chunks(client, echo=True, max_tokens=0)
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in streamed] == [(PROMPT, "length")]


async def test_prompt_logprobs_on_each_choice(
    client: TestClient[Any, Any], tokenizer: TextTokenizer
) -> None:
    prompt_ids = tokenizer.encode(PROMPT)
    body = await post(client, prompt_logprobs=2, n=2, logprobs=1)
    for choice in body["choices"]:
        plp = choice["prompt_logprobs"]
        assert len(plp) == len(prompt_ids) and plp[0] is None
        first = plp[1]
        assert list(first) == [str(prompt_ids[1]), "7", "8"]  # the prompt token first
        assert first[str(prompt_ids[1])] == {"logprob": -0.1, "rank": 1, "decoded_token": tokenizer.decode([prompt_ids[1]])}
        assert first["8"] == {"logprob": -0.02, "rank": 2, "decoded_token": tokenizer.decode([8])}


async def test_continuous_usage_counts_each_choice_so_far(client: TestClient[Any, Any], pool: ScriptedPool) -> None:
    streamed = await chunks(client, n=2, stream_options={"include_usage": True, "continuous_usage_stats": True})
    *token_chunks, last = streamed
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 2 * len(pool.tokens)
    for index in (0, 1):
        counts = [c["usage"]["completion_tokens"] for c in token_chunks if c["choices"][0]["index"] == index]
        assert counts == sorted(counts) and counts[-1] == len(pool.tokens)
    assert all(c["usage"]["prompt_tokens"] == c["usage"]["total_tokens"] - c["usage"]["completion_tokens"] > 0 for c in token_chunks)
    plain = await chunks(client, stream_options={"include_usage": True})
    assert all(c["usage"] is None for c in plain[:-1])


async def test_request_id_names_the_response(client: TestClient[Any, Any], pool: ScriptedPool) -> None:
    body = await post(client, request_id="eval-42")
    assert body["id"] == "cmpl-eval-42"
    assert not pool.submitted[-1].request_id.startswith("cmpl-eval-42")  # the engine's stay unique


async def test_choices_are_numbered_prompt_major_and_each_prompt_counted_once(tokenizer: TextTokenizer) -> None:
    reply = "Hello there"
    pool = FakePool(tokenizer.encode(reply, add_special_tokens=False))
    async with TestClient(TestServer(_app(tokenizer, pool))) as client:
        r = await client.post("/v1/completions", json={"model": "m", "prompt": [[3, 4], [5]], "n": 2})
        assert r.status == 200
        body = await r.json()
    assert [(req.request_id, req.prompt_token_ids) for req in pool.submitted] == [
        (f"{body['id']}-0", [3, 4]),
        (f"{body['id']}-1", [3, 4]),
        (f"{body['id']}-2", [5]),
        (f"{body['id']}-3", [5]),
    ]
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(i, reply) for i in range(4)]
    n = len(pool.tokens)
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (3, 4 * n)


def test_prompt_logprobs_from_the_workers_parts() -> None:
    parts = [
        protocol.PromptLogprobs("r", 1, [-1.0], [2], [[5]], [[-0.5]]),
        protocol.PromptLogprobs("r", 2, [-2.0], [1], [[9]], [[-2.0]]),
    ]
    assert prompt_logprobs([3, 4, 9], parts) == [
        None, PromptLogprob(4, -1.0, 2, [(5, -0.5)]), PromptLogprob(9, -2.0, 1, [(9, -2.0)])
    ]  # fmt: skip
    with pytest.raises(RuntimeError):
        prompt_logprobs([3, 4, 9], parts[1:])  # a gap: an internal error, never a wrong answer
    with pytest.raises(RuntimeError):
        prompt_logprobs([3, 4, 9, 1], parts)

