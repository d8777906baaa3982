"""vLLM's remaining sampling and output fields as the schemas read them: prompt_logprobs, echo
with max_tokens 0, suffix, include_stop_str_in_output, return_tokens_as_token_ids,
truncate_prompt_tokens, stream_options.continuous_usage_stats, request_id and a literal
extra_body."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from omni.engines.generation import response_id
from omni.errors import APIError
from omni.serving.requests import parse_chat_completion_request, parse_completion_request
from omni.serving.requests.fields import merge_extra_body
from omni.serving.sampling import sampling_params, truncate_prompt, truncated_media
from omni.text.tokenizer import TextTokenizer
from scheduler.request import MediaSpan
from tests.omni.serving.requests.test_fields import chat, completion


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def param_of(body: dict[str, Any], parse: Any = parse_completion_request) -> str | None:
    with pytest.raises(APIError) as info:
        parse(body)
    assert info.value.status == 400
    return info.value.param


def test_defaults_change_nothing() -> None:
    r = parse_completion_request(completion())
    assert (r.echo, r.prompt_logprobs, r.num_prompt_logprobs, r.include_stop_str_in_output) == (False, None, None, False)
    assert (r.return_tokens_as_token_ids, r.truncate_prompt_tokens, r.request_id, r.continuous_usage) == (
        False, None, None, False
    )  # fmt: skip


def test_prompt_logprobs_are_counted_and_bounded() -> None:
    assert parse_completion_request(completion(prompt_logprobs=0)).num_prompt_logprobs == 0
    assert parse_chat_completion_request(chat(prompt_logprobs=20)).num_prompt_logprobs == 20
    for bad in (21, -1, -2, 1.5, True, "1"):
        assert param_of(completion(prompt_logprobs=bad)) == "prompt_logprobs"
        assert param_of(chat(prompt_logprobs=bad), parse_chat_completion_request) == "prompt_logprobs"
    # vLLM's rule: none beyond 0 in a stream; 0 is accepted and shows nothing
    assert param_of(completion(prompt_logprobs=1, stream=True)) == "prompt_logprobs"
    assert parse_completion_request(completion(prompt_logprobs=0, stream=True)).num_prompt_logprobs is None


def test_echo_with_logprobs_asks_for_the_prompts_logprobs() -> None:
    assert parse_completion_request(completion(echo=True)).num_prompt_logprobs is None
    assert parse_completion_request(completion(echo=True, logprobs=2)).num_prompt_logprobs == 2
    # the larger of what prompt_logprobs shows and what echo lists
    r = parse_completion_request(completion(echo=True, logprobs=1, prompt_logprobs=4))
    assert r.num_prompt_logprobs == 4
    # streamed, echo still needs them (prompt_logprobs itself shows nothing there)
    r = parse_completion_request(completion(echo=True, logprobs=3, stream=True))
    assert r.num_prompt_logprobs == 3


def test_max_tokens_zero_only_with_echo_on_completions(tok: TextTokenizer) -> None:
    r = parse_completion_request(completion(echo=True, max_tokens=0, logprobs=1))
    params = sampling_params(r, num_prompt_tokens=3, max_model_len=16, tokenizer=tok)
    assert (params.max_tokens, params.prefill_only, params.prompt_logprobs) == (0, True, 1)
    assert param_of(completion(max_tokens=0)) == "max_tokens"
    assert param_of(completion(max_tokens=-1, echo=True)) == "max_tokens"
    assert param_of(chat(max_tokens=0), parse_chat_completion_request) == "max_tokens"
    assert param_of(chat(max_completion_tokens=0), parse_chat_completion_request) == "max_completion_tokens"
    with pytest.raises(APIError, match="echo"):
        parse_completion_request(completion(max_tokens=0))


def test_suffix_is_refused_naming_it() -> None:
    with pytest.raises(APIError, match="fill in the middle") as info:
        parse_completion_request(completion(suffix=" the end"))
    assert (info.value.status, info.value.param, info.value.code) == (400, "suffix", "unsupported_parameter")
    assert parse_completion_request(completion(suffix="")).echo is False  # nothing to insert
    assert param_of(completion(suffix=3)) == "suffix"


def test_flags_are_booleans() -> None:
    r = parse_chat_completion_request(chat(include_stop_str_in_output=True, return_tokens_as_token_ids=True))
    assert r.include_stop_str_in_output and r.return_tokens_as_token_ids
    for name in ("include_stop_str_in_output", "return_tokens_as_token_ids", "echo"):
        assert param_of(completion(**{name: "yes"})) == name


def test_truncate_prompt_tokens() -> None:
    assert parse_completion_request(completion(truncate_prompt_tokens=3)).truncate_prompt_tokens == 3
    assert parse_chat_completion_request(chat(truncate_prompt_tokens=-1)).truncate_prompt_tokens == -1
    for bad in (0, -2, 2.5, "3"):
        assert param_of(completion(truncate_prompt_tokens=bad)) == "truncate_prompt_tokens"
    ids = list(range(10, 20))
    keep = parse_completion_request(completion(truncate_prompt_tokens=3))
    assert truncate_prompt(ids, keep, max_model_len=64) == [17, 18, 19]
    assert truncate_prompt(ids[:2], keep, max_model_len=64) == [10, 11]
    whole = parse_completion_request(completion(truncate_prompt_tokens=-1))
    assert truncate_prompt(ids, whole, max_model_len=4) == [16, 17, 18, 19]
    assert truncate_prompt(ids, parse_completion_request(completion()), max_model_len=4) == ids


def test_truncation_moves_media_spans_or_refuses_to_cut_one() -> None:
    # prompt positions: 0 1 [2 .. 5] 6 7 [8 9] 10
    spans = (MediaSpan(2, 4, "enc/a"), MediaSpan(8, 2, "enc/b"))
    assert truncated_media(spans, 0) == spans
    assert truncated_media(spans, 6) == (MediaSpan(2, 2, "enc/b"),)
    assert truncated_media(spans, 10) == ()
    for cut in (3, 9):
        with pytest.raises(APIError) as info:
            truncated_media(spans, cut)
        assert info.value.param == "truncate_prompt_tokens"


def test_continuous_usage_needs_include_usage() -> None:
    def parsed(options: dict[str, Any]) -> tuple[bool, bool]:
        r = parse_completion_request(completion(stream=True, stream_options=options))
        return r.include_usage, r.continuous_usage

    assert parsed({"include_usage": True, "continuous_usage_stats": True}) == (True, True)
    assert parsed({"continuous_usage_stats": True}) == (False, False)  # as vLLM: usage was not asked
    assert parsed({"include_usage": True}) == (True, False)
    body = completion(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": 1})
    assert param_of(body) == "stream_options.continuous_usage_stats"


def test_request_id() -> None:
    assert parse_completion_request(completion(request_id="batch-7/item 3")).request_id == "batch-7/item 3"
    assert parse_chat_completion_request(chat(request_id="x" * 256)).request_id == "x" * 256
    for bad in ("", "x" * 257, "tab\there", "new\nline", 7):
        assert param_of(completion(request_id=bad)) == "request_id"
    assert response_id("cmpl", "mine", "cmpl-generated") == "cmpl-mine"
    assert response_id("cmpl", None, "cmpl-generated") == "cmpl-generated"


def test_a_literal_extra_body_is_merged_over_the_body() -> None:
    body = {"model": "m", "temperature": 1.0, "extra_body": {"temperature": 0.0, "top_k": 3}}
    assert merge_extra_body(body) == {"model": "m", "temperature": 0.0, "top_k": 3}
    assert merge_extra_body({"model": "m", "extra_body": None}) == {"model": "m"}
    assert merge_extra_body({"model": "m"}) == {"model": "m"}
    with pytest.raises(APIError) as info:
        merge_extra_body({"model": "m", "extra_body": ["top_k"]})
    assert (info.value.status, info.value.param) == (400, "extra_body")
