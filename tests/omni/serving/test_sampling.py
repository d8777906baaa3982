"""sampling_params copies every SamplingParams field a request holds under the same name, and
derives the rest: a new sampling field needs no line in serving/sampling.py, and none is lost."""

from __future__ import annotations

import dataclasses

import pytest

from omni.serving.requests import ChatCompletionRequest, CompletionRequest
from omni.serving.sampling import COPIED_FIELDS
from scheduler.request import SamplingParams

DERIVED = {"max_tokens", "logprobs", "stop_token_ids", "bad_words_token_ids", "prompt_logprobs"}


def test_every_field_is_copied_or_derived() -> None:
    assert set(COPIED_FIELDS) | DERIVED == {f.name for f in dataclasses.fields(SamplingParams)}
    assert not set(COPIED_FIELDS) & DERIVED


@pytest.mark.parametrize("request_type", [ChatCompletionRequest, CompletionRequest])
def test_both_requests_hold_every_copied_field(request_type: type) -> None:
    missing = [name for name in COPIED_FIELDS if not hasattr(request_type, name)]
    assert missing == []
