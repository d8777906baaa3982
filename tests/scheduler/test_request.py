"""Request: its counters and the rule that ends it (EOS, a stop token, max_tokens, min_tokens
holding stops back, ignore_eos), and MediaSpan's range."""

from __future__ import annotations

import pytest

from scheduler.request import MediaSpan, Request, RequestId, RequestStatus, SamplingParams

EOS = 2


def request(max_tokens: int = 5, **params: object) -> Request:
    return Request(RequestId("r"), [7, 8, 9], SamplingParams(max_tokens=max_tokens, **params), eos_token_ids=frozenset({EOS}))  # type: ignore[arg-type]


def run(r: Request, tokens: list[int]) -> list[RequestStatus]:
    statuses = []
    for t in tokens:
        r.append_output_token(t)
        statuses.append(r.status)
    return statuses


def test_the_counters_follow_the_tokens() -> None:
    r = request()
    run(r, [10, 11])
    assert (r.num_prompt_tokens, r.num_output_tokens, r.num_tokens) == (3, 2, 5)
    assert r.all_token_ids == [7, 8, 9, 10, 11]
    assert r.prompt_token_ids == [7, 8, 9]  # all_token_ids is a new list, the prompt untouched


def test_max_tokens_ends_it_as_length_and_eos_as_stop() -> None:
    assert run(request(max_tokens=2), [10, 11])[-1] is RequestStatus.FINISHED_LENGTH
    assert run(request(), [10, EOS]) == [RequestStatus.WAITING, RequestStatus.FINISHED_STOPPED]
    # an EOS that is also the last allowed token: a stop, not a length
    assert run(request(max_tokens=2), [10, EOS])[-1] is RequestStatus.FINISHED_STOPPED


def test_a_stop_token_stops_even_with_ignore_eos_which_only_ignores_eos() -> None:
    assert run(request(stop_token_ids=(42,), ignore_eos=True), [EOS, 42]) == [RequestStatus.WAITING, RequestStatus.FINISHED_STOPPED]


@pytest.mark.parametrize("stop", [EOS, 42])
def test_min_tokens_holds_stops_back_until_that_many_tokens_are_out(stop: int) -> None:
    r = request(max_tokens=10, min_tokens=3, stop_token_ids=(42,))
    assert run(r, [stop, stop, stop]) == [RequestStatus.WAITING] * 3
    assert run(r, [stop]) == [RequestStatus.FINISHED_STOPPED]  # the 4th token may stop


def test_finished_statuses_double_as_finish_reasons() -> None:
    finished = [s for s in RequestStatus if s.is_finished]
    assert [s.value for s in finished] == ["stop", "length", "abort"]
    assert not any(s.is_finished for s in (RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED))


def test_params_say_greedy_and_prefill_only() -> None:
    assert SamplingParams(max_tokens=1, temperature=0.0).greedy
    assert not SamplingParams(max_tokens=1).greedy
    assert SamplingParams(max_tokens=0).prefill_only and not SamplingParams(max_tokens=1).prefill_only


def test_prompt_logprobs_keep_a_request_off_the_prefix_cache() -> None:
    assert request().reads_prefix_cache
    assert not request(prompt_logprobs=0).reads_prefix_cache


def test_a_media_span_ends_after_its_rows() -> None:
    assert MediaSpan(offset=4, num_rows=6, key="in/a").end == 10
