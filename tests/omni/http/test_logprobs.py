"""Logprobs in the API's shapes: chat's entries, legacy completions' parallel lists (the token
itself first among its top), vLLM's prompt_logprobs by position, each token named by its text
or as "token_id:N"."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni.engines.generation import PromptLogprob, TokenLogprob
from omni.http.logprobs import (
    OffsetToken,
    chat_logprob_entries,
    completion_logprobs,
    logprob_entry,
    prompt_logprobs_json,
    token_name,
)
from omni.serving.bodies import ChatTokenLogprob, CompletionLogprobs, LogprobEntry, PromptTokenLogprob
from omni.text.tokenizer import TextTokenizer

HELLO, THERE, COMMA = 1256, 964, 11  # "Hello", " there", "," in the tiny tokenizer
EOS = 1282


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    assert [tokenizer.decode([t]) for t in (HELLO, THERE, COMMA)] == ["Hello", " there", ","]
    return tokenizer


def test_a_token_is_named_by_its_text_special_ones_written_out_or_by_its_id(tokenizer: TextTokenizer) -> None:
    assert token_name(tokenizer, THERE) == " there"
    assert token_name(tokenizer, EOS) == tokenizer.decode([EOS], skip_special_tokens=False) != ""
    assert token_name(tokenizer, THERE, as_token_ids=True) == "token_id:964"
    assert logprob_entry(tokenizer, THERE, -0.5) == LogprobEntry(" there", -0.5, list(b" there"))


def test_chat_entries_carry_each_tokens_alternatives(tokenizer: TextTokenizer) -> None:
    entries = chat_logprob_entries(tokenizer, [TokenLogprob(HELLO, -0.1, [(HELLO, -0.1), (COMMA, -2.5)])])
    assert entries == [
        ChatTokenLogprob("Hello", -0.1, list(b"Hello"), [LogprobEntry("Hello", -0.1, list(b"Hello")), LogprobEntry(",", -2.5, [44])])
    ]
    by_id = chat_logprob_entries(tokenizer, [TokenLogprob(COMMA, -1.0, [])], as_token_ids=True)
    assert by_id == [ChatTokenLogprob("token_id:11", -1.0, list(b"token_id:11"), [])]


def test_completion_logprobs_put_the_token_first_among_its_top(tokenizer: TextTokenizer) -> None:
    tokens = [
        OffsetToken(HELLO, None, None, 0),  # an echoed prompt's first token: nothing predicts it
        OffsetToken(THERE, -0.5, [(COMMA, -0.25), (THERE, -0.5)], 5),
        OffsetToken(COMMA, -1.0, None, 11),  # no alternatives asked for
    ]
    assert completion_logprobs(tokenizer, tokens) == CompletionLogprobs(
        ["Hello", " there", ","],
        [None, -0.5, -1.0],
        [None, {" there": -0.5, ",": -0.25}, None],
        [0, 5, 11],
    )
    top = completion_logprobs(tokenizer, tokens, as_token_ids=True).top_logprobs[1]
    assert top is not None and list(top) == ["token_id:964", "token_id:11"]  # the token itself first


def test_prompt_logprobs_by_position_the_prompt_token_first(tokenizer: TextTokenizer) -> None:
    entries = [
        None,
        PromptLogprob(THERE, -2.0, 3, [(COMMA, -0.5), (HELLO, -1.0), (THERE, -2.0)]),
        PromptLogprob(COMMA, -0.1, 1, [(COMMA, -0.1), (HELLO, -3.0)]),
    ]
    assert prompt_logprobs_json(tokenizer, entries) == [
        None,
        {
            "964": PromptTokenLogprob(-2.0, 3, " there"),
            "11": PromptTokenLogprob(-0.5, 1, ","),
            "1256": PromptTokenLogprob(-1.0, 2, "Hello"),
        },
        {"11": PromptTokenLogprob(-0.1, 1, ","), "1256": PromptTokenLogprob(-3.0, 2, "Hello")},
    ]
    first_only = prompt_logprobs_json(tokenizer, entries, num_top=1)
    assert first_only[1] is not None and list(first_only[1]) == ["964", "11"]
    assert list(prompt_logprobs_json(tokenizer, entries, num_top=0)[2] or {}) == ["11"]
