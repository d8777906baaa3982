"""The Responses API's lifecycle without HTTP, on a FakePool: the request is answered as chat's
turn, the conversation to store is the turn's messages, previous_response_id reads the stored
turns back (a 400 naming it when they are gone), and chat's refusals name the Responses field."""

from __future__ import annotations

import pytest

from omni.errors import APIError
from omni.serving.model import ModelRegistry
from omni.serving.requests.responses import parse_response_request
from omni.serving.responses import create as lifecycle
from omni.serving.responses.store import ResponseStore
from tests.omni.serving.text_model import REPLY, AdmittingPool, run


async def test_a_turn_is_answered_by_chat_and_continues_a_stored_one(models: ModelRegistry, pool: AdmittingPool) -> None:
    responses = ResponseStore()
    req = parse_response_request({"model": "m", "input": "Hi", "instructions": "Be brief."})
    run_ = await lifecycle.response(models, req, responses=responses, store=None, timeout=None)
    assert pool.submitted == []  # nothing runs before the response asks for the outputs
    assert await run(run_.outputs) == [(REPLY, "length")]
    assert [m.role for m in run_.turn.chat.messages] == ["system", "user"]
    assert [m["role"] for m in run_.turn.messages] == ["user"]  # the instructions are not carried on
    responses.put("resp_1", {"id": "resp_1"}, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": REPLY}])
    follow = parse_response_request({"model": "m", "input": "More", "previous_response_id": "resp_1"})
    run_ = await lifecycle.response(models, follow, responses=responses, store=None, timeout=None)
    assert [m.role for m in run_.turn.chat.messages] == ["user", "assistant", "user"]
    await responses.close()


async def test_a_previous_response_that_is_gone_is_a_400_naming_it(models: ModelRegistry, pool: AdmittingPool) -> None:
    responses = ResponseStore()
    req = parse_response_request({"model": "m", "input": "Hi", "previous_response_id": "resp_gone"})
    with pytest.raises(APIError) as e:
        await lifecycle.response(models, req, responses=responses, store=None, timeout=None)
    assert (e.value.status, e.value.param) == (400, "previous_response_id")
    await responses.close()


async def test_chats_refusal_names_the_responses_field(models: ModelRegistry, pool: AdmittingPool) -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    req = parse_response_request({"model": "m", "input": [{"role": "user", "content": [image]}]})
    with pytest.raises(APIError) as e:
        await lifecycle.response(models, req, responses=ResponseStore(), store=None, timeout=None)
    assert (e.value.status, e.value.param) == (400, "input[0].content[0]")
    assert pool.submitted == []
