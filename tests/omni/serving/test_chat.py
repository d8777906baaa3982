"""Chat's lifecycle, called directly with a FakePool for the workers: the step order (what is
refused before what), the requests each choice submits, and that nothing is submitted before
the outputs are run. The responses over HTTP are the handlers' tests (tests/omni/http/handlers)."""

from __future__ import annotations

import pytest

from omni.errors import APIError
from omni.serving import chat as lifecycle
from omni.serving.model import ModelRegistry
from omni.serving.prepared import Completion
from omni.serving.requests import parse_chat_completion_request
from omni.text.tokenizer import TextTokenizer
from tests.omni.fake_pool import FakePool
from tests.omni.serving.text_model import REPLY, USER_HI, AdmittingPool, run

PNG_URL = "data:image/png;base64,iVBORw0KGgo="

async def chat(models: ModelRegistry, **body: object) -> Completion:
    req = parse_chat_completion_request({"model": "m", "messages": [USER_HI], **body})
    return await lifecycle.chat(models, req, store=None, timeout=None)


async def test_chat_submits_one_request_per_choice_once_run(
    models: ModelRegistry, pool: AdmittingPool, tokenizer: TextTokenizer
) -> None:
    completion = await chat(models, n=2)
    assert pool.submitted == []  # nothing runs before the response asks for the outputs
    assert completion.id.startswith("chatcmpl-") and completion.model.name == "m"
    assert await run(completion.outputs) == [(REPLY, "length")] * 2
    prompt = tokenizer.apply_chat_template([USER_HI])
    assert [req.request_id for req in pool.submitted] == [f"{completion.id}-0", f"{completion.id}-1"]
    assert all(req.prompt_token_ids == prompt for req in pool.submitted)
    n = len(pool.tokens)
    assert [(o.usage.prompt_tokens, o.usage.completion_tokens) for o in completion.outputs] == [(len(prompt), n)] * 2
    assert completion.generations == [o.generation for o in completion.outputs]


async def test_chat_while_starting_is_a_503_before_media_is_looked_at(
    models: ModelRegistry, pool: FakePool
) -> None:
    pool.serving = False
    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    with pytest.raises(APIError) as e:
        await chat(models, messages=[{"role": "user", "content": [image]}])
    assert (e.value.status, e.value.headers["Retry-After"]) == (503, "5")
    assert pool.submitted == []


async def test_chat_media_on_a_text_only_model_is_a_400_naming_the_part(
    models: ModelRegistry, pool: FakePool
) -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    with pytest.raises(APIError) as e:
        await chat(models, messages=[{"role": "user", "content": [{"type": "text", "text": "Look"}, audio]}])
    assert (e.value.status, e.value.param) == (400, "messages[0].content[1]")
    assert e.value.code == "unsupported_content_type"
    assert pool.submitted == []


async def test_an_unknown_model_is_a_404(models: ModelRegistry) -> None:
    with pytest.raises(APIError) as e:
        await chat(models, model="nope")
    assert (e.value.status, e.value.code) == (404, "model_not_found")


async def test_a_turn_referring_to_a_spoken_answer_without_a_store_is_a_400_naming_it(
    models: ModelRegistry, pool: FakePool
) -> None:
    turn = {"role": "assistant", "audio": {"id": "audio_x"}}
    with pytest.raises(APIError) as e:
        await chat(models, messages=[USER_HI, turn, USER_HI])
    assert (e.value.status, e.value.param) == (400, "messages[1].audio.id")
    assert pool.submitted == []
