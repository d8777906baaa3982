"""POST /v1/responses, GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel.
The turn is chat's (omni.serving.responses.create.response); its output items and events are
omni/serving/responses/events.py's; stored responses live in the app's ResponseStore
(omni/serving/responses/store.py) for a bounded time.

A whole response is the events' last state. A stream sends each event as `event: <type>` and
`data: <json>` lines (no [DONE], as OpenAI's). A background response answers at once with
status queued; a task of the store runs it, updating the stored response, and cancel stops it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import msgspec
from aiohttp import web

from omni.engines.generation import Delta
from omni.engines.llm import EngineError
from omni.errors import APIError, bad_request
from omni.http import sse
from omni.http.access_log import note_generation
from omni.http.body import body_timeout, read_parsed, request_timeout
from omni.http.state import MODELS, RESPONSES, STORE
from omni.modalities.outputs.image import ImagePreview
from omni.serving.errors import engine_error
from omni.serving.requests.responses import ResponseRequest, parse_response_request
from omni.serving.responses import create as lifecycle
from omni.serving.responses.events import Event, ResponseEvents, new_id
from omni.serving.responses.store import ResponseStore

RESPONSE_ID = "response_id"  # the routes' path parameter


async def create_response(request: web.Request) -> web.StreamResponse:
    req = await read_parsed(request, parse_response_request, timeout=body_timeout(request))
    if req.background and req.stream:
        raise bad_request("'background' responses are not streamed; GET the response instead.", param="stream")
    responses = request.app[RESPONSES]
    run = await lifecycle.response(
        request.app[MODELS], req, responses=responses, store=request.app.get(STORE), timeout=request_timeout(request)
    )
    note_generation(request, run.model.name, run.generations)
    events = _events(req, run)
    if req.background:
        events.response["status"] = "queued"
        responses.put(events.response["id"], events.response, run.turn.messages)
        responses.run_in_background(events.response["id"], _background(responses, req, run, events))
        return await sse.json_response(events.response)
    with run.admitted():  # or a 429, before any response is written
        if req.stream:
            return await _stream(request, req, run, events, responses)
        async with aclosing(_run(run, events, raise_errors=True)) as stream:
            async for _ in stream:
                pass
        _keep(responses, req, run, events)
        return await sse.json_response(events.response)


async def get_response(request: web.Request) -> web.Response:
    response_id = request.match_info[RESPONSE_ID]
    return await sse.json_response((await _stored(request.app[RESPONSES], response_id)).response)


async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info[RESPONSE_ID]
    if not await request.app[RESPONSES].remove(response_id):
        raise _not_found(response_id)
    return await sse.json_response({"id": response_id, "object": "response.deleted", "deleted": True})


async def cancel_response(request: web.Request) -> web.Response:
    """Only a background response can be cancelled; one that already ended is returned as it is."""
    responses = request.app[RESPONSES]
    response_id = request.match_info[RESPONSE_ID]
    record = await _stored(responses, response_id)
    if not record.response.get("background"):
        raise bad_request("Only background responses can be cancelled.", param=RESPONSE_ID)
    if responses.cancel(response_id):
        record.response["status"] = "cancelled"
    return await sse.json_response(record.response)


# ----------------------------------------------------------------------------- running a turn


def _events(req: ResponseRequest, run: lifecycle.Response) -> ResponseEvents:
    tool = run.turn.image_tool
    response: dict[str, Any] = {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": req.background,
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": run.model.name,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": msgspec.to_builtins(req.reasoning) if req.reasoning is not None else {"effort": None, "summary": None},
        "store": req.store,
        "temperature": req.temperature,
        "text": msgspec.to_builtins(req.text) if req.text is not None else {"format": {"type": "text"}},
        "tool_choice": msgspec.to_builtins(req.tool_choice),
        "tools": msgspec.to_builtins(req.tools),
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": None,
        "metadata": req.metadata or {},
        "completed_at": None,
    }
    output_format = tool.output_format if tool is not None else "png"
    return ResponseEvents(response, run.output_format, t2i_call=run.turn.t2i_call, output_format=output_format)


async def _run(run: lifecycle.Response, events: ResponseEvents, *, raise_errors: bool = False) -> AsyncGenerator[Event, None]:
    """The turn's events, in order: its deltas' and its images' previews side by side (a
    preview arrives while the image it belongs to is drawn, before the delta that carries it).
    A failed engine ends them with error and response.failed, or with raise_errors its
    status (a whole response: nothing is sent yet)."""
    for event in events.start():
        yield event
    queue = run.previews
    done = object()

    async def pump() -> None:
        try:
            async with aclosing(run.outputs[0].deltas()) as deltas:
                async for delta in deltas:
                    queue.put_nowait(delta)
        except Exception as exc:  # handed to the loop below
            queue.put_nowait(exc)
            return
        queue.put_nowait(done)

    task = asyncio.create_task(pump())
    finish_reason: str | None = None
    try:
        while True:
            item = await queue.get()
            if item is done:
                break
            if isinstance(item, ImagePreview):
                for event in events.preview(item):
                    yield event
            elif isinstance(item, Delta):
                finish_reason = item.finish_reason or finish_reason
                for event in events.push(item):
                    yield event
            elif isinstance(item, EngineError):
                error = engine_error(item)
                if raise_errors:
                    raise error from item
                for event in events.fail(error.code or "server_error", error.message):
                    yield event
                return
            else:
                raise item
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    usage = run.outputs[0].usage
    for event in events.finish(finish_reason, usage):
        yield event


def _keep(responses: ResponseStore, req: ResponseRequest, run: lifecycle.Response, events: ResponseEvents) -> None:
    if req.store:
        responses.put(events.response["id"], events.response, [*run.turn.messages, events.assistant_message()])


async def _stream(
    request: web.Request, req: ResponseRequest, run: lifecycle.Response, events: ResponseEvents, responses: ResponseStore
) -> web.StreamResponse:
    response = await sse.open_event_stream(request)
    if req.store:  # GET finds it while it runs
        responses.put(events.response["id"], events.response, run.turn.messages)
    async with aclosing(_run(run, events)) as stream:
        async for event in stream:
            await response.write(b"event: " + event["type"].encode() + b"\ndata: " + sse.encode(event) + b"\n\n")
    _keep(responses, req, run, events)
    await response.write_eof()
    return response


async def _background(responses: ResponseStore, req: ResponseRequest, run: lifecycle.Response, events: ResponseEvents) -> None:
    """A background run: admitted when it starts; the stored response follows it."""
    try:
        with run.admitted():
            async with aclosing(_run(run, events)) as stream:
                async for _ in stream:
                    pass
    except asyncio.CancelledError:
        events.response["status"] = "cancelled"
        raise
    except Exception as exc:  # refused at admission (429), say: the client reads it with GET
        code = exc.code if isinstance(exc, APIError) and exc.code else "server_error"
        events.response |= {"status": "failed", "error": {"code": code, "message": str(exc) or type(exc).__name__}}
    _keep(responses, req, run, events)


async def _stored(responses: ResponseStore, response_id: str) -> Any:
    record = await responses.fetch(response_id)
    if record is None:
        raise _not_found(response_id)
    return record


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param=RESPONSE_ID, code="not_found")
