"""The request lifecycle, called directly with a FakePool for the workers: the step order (what is
refused before what), the requests each choice submits, that nothing is submitted before the
outputs are run, and what admitted() admits. The responses over HTTP are the handlers' tests
(tests/omni/http/handlers)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from omni.engines.pool import ModelPool
from omni.errors import APIError
from omni.modalities.outputs.router import OutputRouter
from omni.serving import lifecycle, speech
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.requests import parse_chat_completion_request, parse_completion_request
from omni.serving.requests.images import parse_image_generation_request
from omni.serving.requests.speech import parse_speech_request
from omni.text.tokenizer import TextTokenizer
from scheduler.request import Request
from tests.omni.fake_pool import FakePool

PNG_URL = "data:image/png;base64,iVBORw0KGgo="
REPLY = "Hello there"
USER_HI = {"role": "user", "content": "Hi"}


@dataclass
class AdmittingPool(FakePool):
    """FakePool, recording each admission: its requests, its deadline, and when it ended."""

    admissions: list[tuple[list[Request], float | None]] = field(default_factory=list)
    released: int = 0

    def admit(self, requests: Sequence[Request], timeout: float | None = None) -> AbstractContextManager[None]:
        self.admissions.append((list(requests), timeout))
        return _Admission(self)


@dataclass
class _Admission(AbstractContextManager[None]):
    pool: AdmittingPool

    def __exit__(self, *exc: object) -> None:
        self.pool.released += 1


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.fixture
def pool(tokenizer: TextTokenizer) -> AdmittingPool:
    return AdmittingPool(tokenizer.encode(REPLY, add_special_tokens=False))


@pytest.fixture
def models(tokenizer: TextTokenizer, pool: FakePool) -> ModelRegistry:
    registry = ModelRegistry()
    registry.add(ServedModel("m", tokenizer, cast(ModelPool, pool), created=0))
    return registry


async def run(outputs: Sequence[OutputRouter]) -> list[tuple[str, str | None]]:
    """Each choice's text and finish reason, run one after another."""
    out = []
    for output in outputs:
        text, finish = "", None
        async for delta in output.deltas():
            text += delta.text
            finish = delta.finish_reason or finish
        out.append((text, finish))
    return out


async def chat(models: ModelRegistry, **body: object) -> lifecycle.Completion:
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


async def test_admitted_admits_every_choice_with_the_deadline(models: ModelRegistry, pool: AdmittingPool) -> None:
    req = parse_chat_completion_request({"model": "m", "messages": [USER_HI], "n": 3})
    completion = await lifecycle.chat(models, req, store=None, timeout=7.5)
    assert pool.admissions == []  # admission is the handler's step, around its response
    with completion.admitted():
        [(requests, timeout)] = pool.admissions
        assert requests == [g.request for g in completion.generations] and timeout == 7.5
        assert pool.released == 0
        await run(completion.outputs)
    assert pool.released == 1
    assert pool.aborted == []  # finished by the worker: nothing to abort


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


async def test_completions_number_choices_prompt_major(models: ModelRegistry, pool: FakePool) -> None:
    req = parse_completion_request({"model": "m", "prompt": [[3, 4], [5]], "n": 2})
    completion = await lifecycle.completion(models, req, timeout=None)
    assert pool.submitted == []
    assert completion.id.startswith("cmpl-")
    assert await run(completion.outputs) == [(REPLY, "length")] * 4
    assert [(req.request_id, req.prompt_token_ids) for req in pool.submitted] == [
        (f"{completion.id}-0", [3, 4]),
        (f"{completion.id}-1", [3, 4]),
        (f"{completion.id}-2", [5]),
        (f"{completion.id}-3", [5]),
    ]
    n = len(pool.tokens)
    assert [(o.usage.prompt_tokens, o.usage.completion_tokens) for o in completion.outputs] == [
        (2, n), (2, n), (1, n), (1, n),
    ]  # fmt: skip


async def test_completions_check_the_prompt_before_the_503(models: ModelRegistry, pool: FakePool) -> None:
    pool.serving = False
    with pytest.raises(APIError) as e:
        await lifecycle.completion(models, parse_completion_request({"model": "m", "prompt": [[1 << 20]]}), timeout=None)
    assert (e.value.status, e.value.param) == (400, "prompt")
    with pytest.raises(APIError) as e:
        await lifecycle.completion(models, parse_completion_request({"model": "m", "prompt": "Hello"}), timeout=None)
    assert e.value.status == 503
    assert pool.submitted == []


async def test_images_and_speech_need_a_model_that_draws_or_speaks(models: ModelRegistry) -> None:
    with pytest.raises(APIError) as e:
        await lifecycle.image_generation(models, parse_image_generation_request({"prompt": "a cat"}), timeout=None)
    assert (e.value.status, e.value.param, e.value.message) == (400, "model", "No served model draws images.")
    with pytest.raises(APIError) as e:
        await speech.speech(models, parse_speech_request({"model": "m", "input": "Hi", "voice": "alloy"}), timeout=None)
    assert (e.value.status, e.value.param) == (400, "model")
    assert e.value.message == "The model 'm' has no audio decoder: it cannot speak."
