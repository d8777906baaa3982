"""The logit processors through the real server and the official client: penalties,
logit_bias, min_p, min_tokens, allowed_token_ids and bad_words, on both endpoints.

The tiny checkpoint's weights are random, so each test makes the outcome certain by
construction (a +100 bias, two allowed tokens) rather than by what the model prefers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from omni.text.tokenizer import TextTokenizer
from tests.e2e.conftest import SKIP_REASONING

MODEL = "omni-tiny"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello there, how are you today?"}]
PROMPT = "The quick brown fox"


class Client(openai.OpenAI):
    """The official client, with the served model it asks and what every chat request adds."""

    def __init__(self, base: str, model: str, chat: dict[str, Any]) -> None:
        super().__init__(base_url=f"{base}/v1", api_key="unused")
        self.model, self.chat_fields = model, chat


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[Client]:
    with Client(server, MODEL, {}) as c:
        yield c


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_model_dir)


@pytest.fixture(scope="module", params=["bare", "published"])
def dialect_client(request: pytest.FixtureRequest) -> Iterator[tuple[Client, TextTokenizer]]:
    """The tests whose chat half goes through a template run on both served dialects
    (conftest.Dialect): the bare checkpoint's server, and the published-layout default."""
    if request.param == "bare":
        base, model, chat, model_dir = request.getfixturevalue("server"), MODEL, {}, request.getfixturevalue("tiny_model_dir")
    else:
        base, model, chat = request.getfixturevalue("speaking_server"), "omni", SKIP_REASONING
        model_dir = request.getfixturevalue("omni_dir")
    with Client(base, model, chat) as c:
        yield c, TextTokenizer.from_dir(model_dir)


def token(tok: TextTokenizer, text: str) -> int:
    (token_id,) = tok.encode(text, add_special_tokens=False)
    return token_id


# The fields the official client takes as keyword arguments; vLLM's go in extra_body.
OPENAI_FIELDS = ("max_tokens", "temperature", "seed", "logit_bias", "logprobs", "presence_penalty", "frequency_penalty")


def _split(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    known = {k: v for k, v in fields.items() if k in OPENAI_FIELDS}
    return known, {k: v for k, v in fields.items() if k not in known}


def chat(client: Client, **fields: Any) -> Any:
    known, extra = _split(fields)
    return client.chat.completions.create(model=client.model, messages=HELLO, extra_body=client.chat_fields | extra, **known)


def complete(client: Client, **fields: Any) -> Any:
    known, extra = _split(fields)
    return client.completions.create(model=client.model, prompt=PROMPT, extra_body=extra, **known)


def tokens(client: Client, **fields: Any) -> list[str]:
    """A completion's tokens, as the strings its logprobs name them by."""
    return list(complete(client, logprobs=0, **fields).choices[0].logprobs.tokens)


def test_logit_bias_of_100_makes_every_token_that_token(dialect_client: tuple[Client, TextTokenizer]) -> None:
    client, tok = dialect_client
    y = token(tok, "y")
    bias = {str(y): 100}
    out = chat(client, max_tokens=12, temperature=1.0, seed=5, logit_bias=bias, logprobs=True)
    choice = out.choices[0]
    assert choice.message.content == "y" * 12
    assert [e.token for e in choice.logprobs.content] == ["y"] * 12
    assert (choice.finish_reason, out.usage.completion_tokens) == ("length", 12)
    assert tokens(client, max_tokens=12, temperature=1.0, logit_bias=bias) == ["y"] * 12
    streamed = client.completions.create(
        model=client.model, prompt=PROMPT, max_tokens=12, temperature=1.0, logit_bias=bias, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == "y" * 12


def test_allowed_token_ids_restrict_the_output(dialect_client: tuple[Client, TextTokenizer]) -> None:
    client, tok = dialect_client
    ab = [token(tok, "a"), token(tok, "b")]
    chat_text = chat(client, max_tokens=16, temperature=1.0, seed=1, allowed_token_ids=ab).choices[0].message.content
    assert len(chat_text) == 16 and set(chat_text) == {"a", "b"}
    sampled = tokens(client, max_tokens=16, temperature=1.0, seed=1, allowed_token_ids=ab)
    assert len(sampled) == 16 and set(sampled) == {"a", "b"}
    assert tokens(client, max_tokens=4, temperature=0, allowed_token_ids=ab[1:]) == ["b"] * 4


def test_min_tokens_holds_back_eos(dialect_client: tuple[Client, TextTokenizer]) -> None:
    client, tok = dialect_client
    (eos,) = tok.eos_token_ids
    pushed = {str(eos): 100}  # the model now wants to stop at once
    now = chat(client, max_tokens=20, temperature=1.0, seed=2, logit_bias=pushed)
    assert (now.choices[0].finish_reason, now.usage.completion_tokens) == ("stop", 1)
    for out in (
        chat(client, max_tokens=20, temperature=1.0, seed=2, logit_bias=pushed, min_tokens=5, ignore_eos=False),
        complete(client, max_tokens=20, temperature=1.0, seed=2, logit_bias=pushed, min_tokens=5),
    ):
        # five tokens that cannot be EOS, then the EOS the bias forces (usage counts it)
        assert (out.choices[0].finish_reason, out.usage.completion_tokens) == ("stop", 6)


def test_min_tokens_holds_back_stop_token_ids(client: Client, tok: TextTokenizer) -> None:
    y = token(tok, "y")
    out = complete(
        client, max_tokens=20, temperature=0, logit_bias={str(y): 100}, stop_token_ids=[y], min_tokens=3, logprobs=0
    )
    assert (out.choices[0].finish_reason, out.usage.completion_tokens) == ("stop", 4)
    names = out.choices[0].logprobs.tokens
    assert "y" not in names[:3] and names[3] == "y"


def test_bad_words_never_come_out(dialect_client: tuple[Client, TextTokenizer]) -> None:
    client, tok = dialect_client
    y = token(tok, "y")
    pushed = {"max_tokens": 12, "temperature": 1.0, "seed": 4, "logit_bias": {str(y): 100}}
    # a one-token bad word is always banned: the +100 bias has nothing left to push
    assert "y" not in tokens(client, bad_words=["y"], **pushed)
    # "yy" is the tokens y, y: a y may come out, but never right after a y; the bias makes
    # every other token one
    assert tok.encode("yy", add_special_tokens=False) == [y, y]
    out = tokens(client, bad_words=["yy"], **pushed)
    assert out[::2] == ["y"] * 6 and "y" not in out[1::2]
    chat_text = chat(client, bad_words=["y"], **pushed).choices[0].message.content
    assert len(chat_text) > 0 and "y" not in chat_text


def test_frequency_and_presence_penalties_spread_greedy_choices(client: Client, tok: TextTokenizer) -> None:
    a, b = token(tok, "a"), token(tok, "b")
    greedy = {"max_tokens": 8, "temperature": 0}
    plain = tokens(client, allowed_token_ids=[a, b], **greedy)
    assert plain == list("abbbabba")  # the fixed checkpoint's choice: b runs ahead by three

    def worst_gap(out: list[str]) -> int:
        return max(abs(out[:i].count("a") - out[:i].count("b")) for i in range(len(out) + 1))

    # The raw logits of the random tiny model differ by less than 2 between any two tokens,
    # so a frequency penalty of 2 makes the more frequent of a and b lose: their counts never
    # drift more than one apart.
    assert worst_gap(plain) == 3
    assert worst_gap(tokens(client, allowed_token_ids=[a, b], frequency_penalty=2.0, **greedy)) == 1
    # A presence penalty of 2 makes any token not yet out beat those that are: eight tokens
    # over eight letters use each once (greedy alone repeats g three times).
    letters = [token(tok, ch) for ch in "abcdefgh"]
    assert tokens(client, allowed_token_ids=letters, **greedy) == list("fdggbegb")
    spread = tokens(client, allowed_token_ids=letters, presence_penalty=2.0, **greedy)
    assert sorted(spread) == list("abcdefgh")


def test_repetition_penalty_and_min_p_are_accepted(client: Client) -> None:
    fields = {"presence_penalty": 1.5, "frequency_penalty": -0.5, "repetition_penalty": 1.3, "min_p": 0.1}
    for out in (
        chat(client, max_tokens=8, temperature=0.8, seed=3, **fields),
        complete(client, max_tokens=8, temperature=0.8, seed=3, **fields),
    ):
        assert out.usage.completion_tokens == 8
    # min_p of 1 keeps only the most probable token: sampling becomes greedy
    greedy = complete(client, max_tokens=8, temperature=0).choices[0].text
    assert complete(client, max_tokens=8, temperature=1.0, seed=9, min_p=1.0).choices[0].text == greedy


BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"1458": 1}}, "logit_bias"),  # one past the tiny vocabulary
    ({"min_p": 1.5}, "min_p"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"max_tokens": 2, "min_tokens": 3}, "min_tokens"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [1458]}, "allowed_token_ids"),
    ({"bad_words": "y"}, "bad_words"),
]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(("fields", "param"), BAD_VALUES)
def test_invalid_values_are_400s_naming_the_field(server: str, path: str, fields: dict[str, Any], param: str) -> None:
    body = {"model": MODEL, "max_tokens": 4, **fields}
    body |= {"messages": HELLO} if path == "/v1/chat/completions" else {"prompt": PROMPT}
    r = httpx.post(f"{server}{path}", json=body, timeout=120)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
