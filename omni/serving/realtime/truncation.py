"""The session's `truncation`: what a response does when the conversation outgrows the model's
context. "auto" (OpenAI's default) leaves out the oldest messages, the fewest that make the
prompt fit; the session's instructions always stay, and the conversation keeps every item.
"disabled" answers the context error (the response fails, the session goes on).

What fits is what chat's turn measures: the template rendered and every image and audio item
expanded to the tokens it stands for (embedding rows and codes), with the room max_output_tokens
asks for. Each try prepares the turn and runs nothing; the fewest messages to leave out are
found by halving, so a long conversation costs a few renders, and items seen before hit the
encoder cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omni.errors import APIError
from omni.serving import chat
from omni.serving.model import ModelRegistry
from omni.serving.prepared import Completion
from omni.serving.requests import ChatCompletionRequest

Request = Callable[[int], ChatCompletionRequest]  # the turn with its oldest n messages left out


def without_oldest(messages: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """messages less the first n, and less any tool output whose call went with them."""
    kept = messages[n:]
    while kept and kept[0]["role"] == "tool":
        kept = kept[1:]
    return kept


async def fitted_chat(
    models: ModelRegistry, request: Request, num_messages: int, *, auto: bool, timeout: float | None
) -> Completion:
    """chat's turn of the whole conversation; over the context with auto, the turn without the
    fewest oldest messages that fits. When not even the last message fits, the context error."""
    try:
        return await chat.chat(models, request(0), store=None, timeout=timeout)
    except APIError as exc:
        if not auto or exc.code != "context_length_exceeded":
            raise
        overflow = exc
    fitted: Completion | None = None
    lo, hi = 1, num_messages - 1  # leaving out every message leaves no turn to answer
    while lo <= hi:  # the least n in [lo, hi] that fits: each fit found is less than the last
        n = (lo + hi) // 2
        try:
            fitted = await chat.chat(models, request(n), store=None, timeout=timeout)
            hi = n - 1
        except APIError as exc:
            if exc.code != "context_length_exceeded":
                raise
            lo = n + 1
    if fitted is None:
        raise overflow
    return fitted
