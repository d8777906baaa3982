"""The worker's SamplingOptions: the scheduler's params of the same name as they are, the rest
reshaped for msgpack in one place (omni/engines/step.py:sampling_options)."""

from __future__ import annotations

import dataclasses

from omni.engines.step import SHARED_OPTIONS, sampling_options
from omni.shared import protocol
from scheduler.request import Request, RequestId, SamplingParams


def test_shared_options_are_params_of_the_same_name() -> None:
    params = {f.name for f in dataclasses.fields(SamplingParams)} | {"prefill_only"}  # a property
    assert set(SHARED_OPTIONS) <= params


def test_sampling_options_of_a_request() -> None:
    params = SamplingParams(
        max_tokens=4, temperature=0.5, top_k=3, seed=7, logprobs=2, min_tokens=2, stop_token_ids=(9,),
        logit_bias=((5, -1.5), (6, 2.0)), min_p=0.1, allowed_token_ids=(1, 2), bad_words_token_ids=((3, 4),),
        repetition_penalty=1.2,
    )  # fmt: skip
    request = Request(RequestId("r"), [1, 2, 3], params, eos_token_ids=frozenset({0}))
    assert sampling_options(request) == protocol.SamplingOptions(
        temperature=0.5, top_k=3, seed=7, logprobs=2, repetition_penalty=1.2,
        logit_bias_token_ids=[5, 6], logit_bias_values=[-1.5, 2.0], min_p=0.1, allowed_token_ids=[1, 2],
        bad_words_token_ids=[[3, 4]], min_tokens=2, min_tokens_stop_ids=[0, 9],
    )  # fmt: skip
