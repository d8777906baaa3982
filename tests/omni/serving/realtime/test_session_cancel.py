"""One realtime session without a socket: client events in, server events out, on a text model
whose worker is a FakePool (its answer "Hello there, world"). The settings, refused events that
leave the session going, the input buffer's commit, one response at a time, and a cancellation,
however soon it comes. (Server VAD and audio answers, over a socket: tests/e2e/test_realtime.py.)"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
import pytest

from omni.engines.pool import ModelPool
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.realtime.session import RealtimeSession
from omni.text.tokenizer import TextTokenizer
from tests.omni.fake_pool import FakePool

HELLO = [1256, 964, 11, 288, 286, 692]  # "Hello there, world"
GUARD_S = 120.0  # a response that never ends fails the test instead of hanging it


class Session:
    """A session and every event it emitted; done() waits for the next response.done."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.pool = FakePool(HELLO, finish_reason="stop")
        model = ServedModel("m", tokenizer, cast(ModelPool, self.pool), created=0)
        models = ModelRegistry()
        models.add(model)
        self.events: list[dict[str, Any]] = []
        self._done = asyncio.Event()
        self.session = RealtimeSession(models, model, self._emit, vad_model=None, max_buffer_seconds=10.0)

    def _emit(self, event: dict[str, Any]) -> None:
        orjson.dumps(event)  # each is plain JSON, as the socket sends it
        self.events.append(event)
        if event["type"] == "response.done":
            self._done.set()

    async def send(self, **event: Any) -> None:
        await self.session.handle(orjson.dumps(event).decode())

    async def done(self) -> dict[str, Any]:
        await asyncio.wait_for(self._done.wait(), GUARD_S)
        self._done.clear()
        return next(e for e in reversed(self.events) if e["type"] == "response.done")["response"]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


@pytest.fixture
async def s(tiny_tokenizer_dir: Path) -> Any:
    session = Session(TextTokenizer.from_dir(tiny_tokenizer_dir))
    session.session.start()
    yield session
    await session.session.close()


async def test_it_starts_with_its_settings_and_updates_them(s: Session) -> None:
    (created,) = s.of("session.created")
    assert created["session"]["output_modalities"] == ["text"]  # the model cannot speak
    await s.send(type="session.update", session={"type": "realtime", "instructions": "Be brief."})
    (updated,) = s.of("session.updated")
    assert updated["session"]["instructions"] == "Be brief."


async def test_a_refused_event_is_an_error_naming_it_and_the_session_goes_on(s: Session) -> None:
    await s.send(type="response.cancel", event_id="ev_1")
    (error,) = s.of("error")
    assert (error["error"]["code"], error["error"]["event_id"]) == ("response_cancel_not_active", "ev_1")
    await s.send(type="no.such.event")
    assert len(s.of("error")) == 2
    await s.send(type="session.update", session={"type": "realtime", "instructions": "x"})
    assert len(s.of("session.updated")) == 1


async def test_a_commit_needs_100_ms_and_makes_a_user_audio_item(s: Session) -> None:
    await s.send(type="input_audio_buffer.commit")
    assert s.of("error")[0]["error"]["code"] == "input_audio_buffer_commit_empty"
    pcm = np.zeros(24000 // 5, dtype="<i2").tobytes()  # 200 ms at 24 kHz
    await s.send(type="input_audio_buffer.append", audio=base64.b64encode(pcm).decode())
    await s.send(type="input_audio_buffer.commit")
    (committed,) = s.of("input_audio_buffer.committed")
    (added,) = s.of("conversation.item.added")
    assert added["item"]["id"] == committed["item_id"] and added["item"]["role"] == "user"
    assert added["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    assert [e["item"]["id"] for e in s.of("conversation.item.done")] == [committed["item_id"]]  # no transcription asked


async def test_a_response_answers_the_conversation(s: Session) -> None:
    await s.send(type="session.update", session={"type": "realtime", "instructions": "Be brief."})
    await s.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]})
    await s.send(type="response.create")
    response = await s.done()
    assert response["status"] == "completed"
    (message,) = response["output"]
    assert message["content"] == [{"type": "output_text", "text": "Hello there, world"}]
    assert response["usage"]["output_tokens"] == len(HELLO)
    (request,) = s.pool.submitted
    prompt = s.session.model.tokenizer.decode(request.prompt_token_ids, skip_special_tokens=False)
    assert prompt.index("Be brief.") < prompt.index("Hi!")
    assert [i["role"] for i in s.session.conversation.items] == ["user", "assistant"]


async def test_one_response_at_a_time(s: Session) -> None:
    await s.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]})
    await s.send(type="response.create")
    await s.send(type="response.create", event_id="ev_2")
    (error,) = s.of("error")
    assert (error["error"]["code"], error["error"]["event_id"]) == ("conversation_already_has_active_response", "ev_2")
    assert (await s.done())["status"] == "completed"
    await s.send(type="response.create")  # the first has ended: a new one may start
    assert (await s.done())["status"] == "completed"


async def test_a_response_cancelled_at_once_ends_cancelled_and_the_next_may_start(s: Session) -> None:
    await s.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]})
    # both frames read in one turn of the loop, before the response's task has run at all
    await s.send(type="response.create")
    await s.send(type="response.cancel")
    response = await s.done()
    assert (response["status"], response["status_details"]["reason"]) == ("cancelled", "client_cancelled")
    await s.send(type="response.create")
    assert (await s.done())["status"] == "completed"
