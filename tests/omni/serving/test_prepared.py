"""What the endpoints' lifecycles share: admitted() admits every choice with the client's
deadline and gives the place back when the response is done; the serving gate; the upload bound
with no media model; a prompt whose answer is the endpoint's output skips the reasoning."""

from __future__ import annotations

import pytest

from omni.errors import APIError
from omni.serving import chat
from omni.serving.model import ModelRegistry
from omni.serving.prepared import answer_template, check_serving, max_upload_bytes
from omni.serving.requests import parse_chat_completion_request
from omni.shared.media import MediaLimits
from tests.omni.serving.text_model import USER_HI, AdmittingPool, run


async def test_admitted_admits_every_choice_with_the_deadline(models: ModelRegistry, pool: AdmittingPool) -> None:
    req = parse_chat_completion_request({"model": "m", "messages": [USER_HI], "n": 3})
    completion = await chat.chat(models, req, store=None, timeout=7.5)
    assert pool.admissions == []  # admission is the handler's step, around its response
    with completion.admitted():
        [(requests, timeout)] = pool.admissions
        assert requests == [g.request for g in completion.generations] and timeout == 7.5
        assert pool.released == 0
        await run(completion.outputs)
    assert pool.released == 1
    assert pool.aborted == []  # finished by the worker: nothing to abort


def test_a_model_still_starting_is_a_503_to_retry(models: ModelRegistry, pool: AdmittingPool) -> None:
    check_serving(models.get("m"))
    pool.serving = False
    with pytest.raises(APIError) as e:
        check_serving(models.get("m"))
    assert (e.value.status, e.value.headers["Retry-After"]) == (503, "5")


def test_uploads_are_bounded_by_the_default_limit_when_no_model_reads_media(models: ModelRegistry) -> None:
    assert max_upload_bytes(models) == MediaLimits().max_bytes


def test_an_answer_template_is_the_chat_template_told_not_to_reason(models: ModelRegistry) -> None:
    model = models.get("m")
    messages = [{"role": "user", "content": "Hi"}]
    expected = model.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, enable_thinking=False, skip_reasoning=True
    )
    assert answer_template(model, messages) == expected
