"""sampling_params copies every SamplingParams field a request holds under the same name, and
derives the rest: a new sampling field needs no line in serving/sampling.py, and none is lost."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from omni.errors import APIError
from omni.serving.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_chat_completion_request,
    parse_completion_request,
)
from omni.serving.sampling import COPIED_FIELDS, sampling_params
from omni.text.tokenizer import TextTokenizer
from scheduler.request import SamplingParams

DERIVED = {"max_tokens", "logprobs", "stop_token_ids", "bad_words_token_ids", "prompt_logprobs"}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "Hi", **fields}


def parse(body: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
    return parse_chat_completion_request(body) if "messages" in body else parse_completion_request(body)


def test_every_field_is_copied_or_derived() -> None:
    assert set(COPIED_FIELDS) | DERIVED == {f.name for f in dataclasses.fields(SamplingParams)}
    assert not set(COPIED_FIELDS) & DERIVED


@pytest.mark.parametrize("request_type", [ChatCompletionRequest, CompletionRequest])
def test_both_requests_hold_every_copied_field(request_type: type) -> None:
    missing = [name for name in COPIED_FIELDS if not hasattr(request_type, name)]
    assert missing == []


@pytest.fixture(scope="module")
def smaller_model(tiny_tokenizer_dir: Path) -> TextTokenizer:
    """The tiny tokenizer (1458 ids) before a model of 1000 rows: its added tokens past the
    model's vocab_size, as a checkpoint may ship them (review A3)."""
    tok = TextTokenizer.from_dir(tiny_tokenizer_dir)
    return TextTokenizer(tok.hf_tokenizer, tok.eos_token_ids, model_vocab_size=1000)


def _word_of_one_token_past(tok: TextTokenizer, bound: int) -> str:
    """A word that encodes, bare, to one token id at or past bound."""
    for token_id in range(bound, tok.vocab_size):
        word = tok.decode([token_id])
        if word.strip() == word and word and tok.encode(word, add_special_tokens=False) == [token_id]:
            return word
    raise AssertionError("the tiny tokenizer has no such word")


@pytest.mark.parametrize("make", [chat, completion])
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": {"1200": 1}}, "logit_bias"),
        ({"allowed_token_ids": [5, 1200]}, "allowed_token_ids"),
        ({"stop_token_ids": [1200], "min_tokens": 2}, "stop_token_ids"),
        ({"bad_words": ["WORD"]}, "bad_words"),
    ],
)
def test_token_ids_are_bounded_by_the_models_vocabulary(
    smaller_model: TextTokenizer, make: Any, fields: dict[str, Any], param: str
) -> None:
    """Every id a request names, or its bad_words encode to, is below the model's rows too:
    a 400 naming the field, not an index past the logits in the worker."""
    if param == "bad_words":
        word = _word_of_one_token_past(smaller_model, 1000)
        fields = {"bad_words": [word]}
        bad = smaller_model.encode(word, add_special_tokens=False)[0]
    else:
        bad = 1200
    request = parse(make(**fields))
    with pytest.raises(APIError) as info:
        sampling_params(request, num_prompt_tokens=10, max_model_len=100, tokenizer=smaller_model)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, "invalid_value")
    assert info.value.message == f"Invalid value for '{param}': token id {bad} is out of range for a vocabulary of 1000."
    request = parse(make(logit_bias={"999": 1}, allowed_token_ids=[999], stop_token_ids=[999]))
    sampling_params(request, num_prompt_tokens=10, max_model_len=100, tokenizer=smaller_model)  # the last row is fine


@pytest.mark.parametrize("make", [chat, completion])
def test_priority_needs_the_priority_policy(smaller_model: TextTokenizer, make: Any) -> None:
    """vLLM's rule: a non-zero priority under fcfs is a 400 naming it; under priority it is
    the scheduler's order, carried in the params to every choice."""
    urgent = parse(make(priority=-5))
    with pytest.raises(APIError) as info:
        sampling_params(urgent, num_prompt_tokens=10, max_model_len=100, tokenizer=smaller_model)
    assert (info.value.status, info.value.param, info.value.code) == (400, "priority", "unsupported_parameter")
    assert "Priority scheduling is not enabled" in info.value.message and "--scheduling-policy fcfs" in info.value.message
    zero = sampling_params(parse(make(priority=0)), num_prompt_tokens=10, max_model_len=100, tokenizer=smaller_model)
    assert zero.priority == 0
    params = sampling_params(
        urgent, num_prompt_tokens=10, max_model_len=100, tokenizer=smaller_model, scheduling_policy="priority"
    )
    assert params.priority == -5


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 1.5, "1", True])
def test_priority_is_a_32_bit_integer(value: Any) -> None:
    with pytest.raises(APIError) as info:
        parse(chat(priority=value))
    assert (info.value.status, info.value.param) == (400, "priority")
