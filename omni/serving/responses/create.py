"""POST /v1/responses without HTTP (the response: omni/http/handlers/responses.py, its items
and events: events.py):

    the stored turns of previous_response_id -> the request as a chat turn (turn.py) -> chat's
    lifecycle (omni/serving/chat.py), its errors renamed to the Responses request's fields
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from omni.errors import APIError, bad_request
from omni.serving.chat import chat
from omni.serving.model import ModelRegistry
from omni.serving.prepared import Completion
from omni.serving.requests.responses import ResponseRequest
from omni.serving.responses.store import ResponseStore
from omni.serving.responses.turn import ResponseTurn, check_image_tool_model, response_turn
from omni.shared.media.errors import MediaError
from omni.shared.store.base import ArtifactStore


@dataclass(frozen=True, slots=True, kw_only=True)
class Response(Completion):
    """A Responses API turn, ready to run: chat's one choice, the turn it answers (the
    conversation to store), and the queue its image previews arrive on (ImagePreview)."""

    turn: ResponseTurn
    previews: asyncio.Queue[Any]


async def response(
    models: ModelRegistry, req: ResponseRequest, *, responses: ResponseStore, store: ArtifactStore | None,
    timeout: float | None,
) -> Response:  # fmt: skip
    """POST /v1/responses: the earlier turns of previous_response_id, then the request as a
    chat turn (omni/serving/responses/turn.py), answered by chat's lifecycle."""
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        earlier = await responses.fetch(req.previous_response_id)
        if earlier is None:
            raise bad_request(
                f"Previous response with id '{req.previous_response_id}' not found (or it expired).",
                param="previous_response_id",
            )
        history = earlier.messages
    model = models.get(req.model)
    check_image_tool_model(models, req)
    turn = response_turn(model, req, history)
    previews: asyncio.Queue[Any] = asyncio.Queue()
    partial = turn.image_tool.partial_images if turn.image_tool is not None and req.stream else 0
    try:
        done = await chat(models, turn.chat, store=store, timeout=timeout, previews=previews, partial_images=partial)
    except (APIError, MediaError) as exc:
        raise turn.params.rename(exc) from None
    fields = {f.name: getattr(done, f.name) for f in dataclasses.fields(done)}
    return Response(**fields, turn=turn, previews=previews)
