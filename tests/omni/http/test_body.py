"""read_parsed: a large body is decoded and parsed in one worker thread, a small one on the
loop; errors are the same either way. And a chat request's messages and parts are bounded."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.errors import APIError
from omni.http.body import _DECODE_IN_THREAD_BYTES, read_parsed
from omni.http.errors import error_middleware
from omni.serving.requests import parse_chat_completion_request
from omni.serving.requests.chat import MAX_CHAT_ITEMS


def _app() -> web.Application:
    async def parsed(request: web.Request) -> web.Response:
        def parse(body: dict[str, Any]) -> dict[str, Any]:
            if body.get("refuse"):
                raise APIError(400, "refused by the parser", param="refuse")
            return {"keys": sorted(body), "main": threading.current_thread() is threading.main_thread()}

        return web.json_response(await read_parsed(request, parse))

    app = web.Application(middlewares=[error_middleware], client_max_size=8 * _DECODE_IN_THREAD_BYTES)
    app.router.add_post("/parsed", parsed)
    return app


@pytest.mark.parametrize("large", [False, True])
async def test_a_large_body_is_parsed_off_the_loop_and_a_small_one_on_it(large: bool) -> None:
    padding = "x" * (2 * _DECODE_IN_THREAD_BYTES if large else 10)
    async with TestClient(TestServer(_app())) as client:
        r = await client.post("/parsed", data=orjson.dumps({"a": 1, "pad": padding, "extra_body": {"b": 2}}))
        assert r.status == 200
        assert await r.json() == {"keys": ["a", "b", "pad"], "main": not large}
        r = await client.post("/parsed", data=orjson.dumps({"refuse": True, "pad": padding}))
        assert (r.status, (await r.json())["error"]["param"]) == (400, "refuse")
        r = await client.post("/parsed", data=orjson.dumps([padding]))
        assert r.status == 400 and "JSON object" in (await r.json())["error"]["message"]
        r = await client.post("/parsed", data=b'{"pad": "' + padding.encode() + b'"')
        assert r.status == 400 and "not valid JSON" in (await r.json())["error"]["message"]


def _chat(messages: list[Any]) -> dict[str, Any]:
    return {"model": "m", "messages": messages}


def test_messages_and_parts_in_all_are_bounded() -> None:
    user = {"role": "user", "content": "hi"}
    parse_chat_completion_request(_chat([user] * MAX_CHAT_ITEMS))
    with pytest.raises(APIError) as e:
        parse_chat_completion_request(_chat([user] * (MAX_CHAT_ITEMS + 1)))
    assert (e.value.status, e.value.param, e.value.code) == (400, "messages", "array_above_max_length")
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}] * (MAX_CHAT_ITEMS // 2)}
    with pytest.raises(APIError) as e:
        parse_chat_completion_request(_chat([parts, parts]))
    assert "2 messages and 16384 content parts" in e.value.message


def test_a_refused_body_is_emptied_a_step_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from omni.http import body as fields
    from omni.http import json_body
    monkeypatch.setattr(json_body, "_FREE_STEP", 3)
    inner = list(range(10))
    body = {"a": [{"b": inner, "c": "x"}] * 2 + [[1, [2, 3]]] * 5, "d": {"e": inner}}
    kept = body["a"]

    def refuse(parsed: dict[str, Any]) -> None:
        raise APIError(400, "no")

    with pytest.raises(APIError):
        fields._decode_and_parse(bytearray(b"{}"), refuse, lambda _: body)
    assert body == {} and kept == [] and inner == []


def test_completions_prompt_ids_are_bounded() -> None:
    from omni.serving.requests import parse_completion_request
    from omni.serving.requests.completions import MAX_PROMPT_ITEMS

    parse_completion_request({"model": "m", "prompt": [1] * MAX_PROMPT_ITEMS})
    with pytest.raises(APIError) as e:
        parse_completion_request({"model": "m", "prompt": [[1] * (MAX_PROMPT_ITEMS // 2)] * 2})
    assert (e.value.param, e.value.code) == ("prompt", "array_above_max_length")


async def test_a_body_of_too_many_items_is_refused_as_it_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    from omni.http import json_body
    monkeypatch.setattr(json_body, "MAX_ITEMS", 1000)
    ids = orjson.dumps({"prompt": list(range(_DECODE_IN_THREAD_BYTES // 4))})
    with pytest.raises(json_body.TooManyItems):
        json_body.decode_json(bytearray(ids))
    async with TestClient(TestServer(_app())) as client:
        r = await client.post("/parsed", data=ids)
        error = (await r.json())["error"]
        assert (r.status, error["code"]) == (400, "array_above_max_length") and "1000 items" in error["message"]
