"""The completions body: the four prompt shapes, each as its prompts; token ids checked before
and after conversion; echo, max_tokens 0 and the logprobs they show."""

from __future__ import annotations

from typing import Any

import pytest

from omni.errors import APIError
from omni.serving.requests import parse_completion_request
from omni.serving.requests.completions import MAX_PROMPT_ITEMS, check_prompt_items, check_token_ids


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "Hi", **fields}


def refused(fields: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as e:
        parse_completion_request(fields)
    assert e.value.status == 400
    return e.value


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [
        ("Hi", ("Hi",)),
        (["a", "b"], ("a", "b")),
        ([1, 2, 3], ((1, 2, 3),)),
        ([[1, 2], [3]], ((1, 2), (3,))),
    ],
)
def test_each_prompt_shape_is_its_prompts(prompt: Any, prompts: tuple[Any, ...]) -> None:
    assert parse_completion_request(body(prompt=prompt)).prompts == prompts


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "must not be empty"),
        ([[1], []], "must not be empty"),
        ([1, -2], "non-negative"),
        (["a", 1], "expected a string, an array of strings"),
        ([True, 1], "expected a string, an array of strings"),
        ([[1, "x"]], "an array of integer token ids"),
    ],
)
def test_a_malformed_prompt_is_a_400(prompt: Any, message: str) -> None:
    error = refused(body(prompt=prompt))
    assert error.param is not None and error.param.startswith("prompt") and message in str(error)


def test_too_many_ids_are_refused_before_conversion() -> None:
    check_prompt_items([[1] * 10] * 10)
    with pytest.raises(APIError) as e:
        check_prompt_items([[0] * MAX_PROMPT_ITEMS])
    assert e.value.code == "array_above_max_length"


def test_token_ids_must_be_in_the_vocabulary() -> None:
    check_token_ids((0, 99), vocab_size=100)
    with pytest.raises(APIError, match="token id 100 is out of range for a vocabulary of 100"):
        check_token_ids((5, 100), vocab_size=100, param="prompt[1]")


def test_max_tokens_zero_is_for_echo_alone() -> None:
    assert refused(body(max_tokens=0)).param == "max_tokens"
    assert parse_completion_request(body(max_tokens=0, echo=True)).max_tokens == 0


def test_prompt_logprobs_shown_are_the_larger_of_echoed_and_asked() -> None:
    assert parse_completion_request(body()).num_prompt_logprobs is None
    assert parse_completion_request(body(echo=True, logprobs=2)).num_prompt_logprobs == 2
    assert parse_completion_request(body(echo=True, logprobs=2, prompt_logprobs=4)).num_prompt_logprobs == 4
    assert parse_completion_request(body(echo=True, logprobs=1, stream=True)).num_prompt_logprobs == 1  # echo streams
    assert refused(body(prompt_logprobs=3, stream=True)).param == "prompt_logprobs"  # never streamed


def test_logprobs_are_at_most_five_and_fill_in_the_middle_is_refused() -> None:
    assert parse_completion_request(body(logprobs=5)).num_logprobs == 5
    assert refused(body(logprobs=6)).param == "logprobs"
    assert refused(body(suffix="end")).param == "suffix"
    assert parse_completion_request(body(suffix="")).prompts == ("Hi",)
