"""The session's `truncation`: what a response does when the conversation outgrows the model's
context, or holds more media items (images, audio turns) than one request may
(--max-media-items). "auto" (OpenAI's default) leaves out the oldest messages, the fewest that
make the turn fit; the session's instructions always stay, and the conversation keeps every
item. "disabled" answers chat's error (the response fails, the session goes on).

What fits is what chat's turn measures: the template rendered and every image and audio item
expanded to the tokens it stands for (embedding rows and codes), with the room max_output_tokens
asks for. Each try prepares the turn and runs nothing; the fewest messages to leave out are
found by halving, so a long conversation costs a few renders, and items seen before hit the
encoder cache.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from omni.errors import APIError
from omni.serving import chat
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.prepared import Completion
from omni.serving.requests import ChatCompletionRequest

Message = dict[str, Any]
Request = Callable[[list[Message]], ChatCompletionRequest]  # the turn's request of these messages
Prepare = Callable[[], Awaitable[Completion]]  # a response's turn, prepared when awaited: Truncation.chat


def without_oldest(messages: list[Message], n: int) -> list[Message]:
    """messages less the first n, and less any tool output whose call went with them."""
    kept = messages[n:]
    while kept and kept[0]["role"] == "tool":
        kept = kept[1:]
    return kept


def num_media(messages: list[Message]) -> int:
    return sum(sum(p["type"] != "text" for p in m["content"]) for m in messages if isinstance(m["content"], list))


@dataclass(frozen=True, slots=True)
class Truncation:
    auto: bool
    max_media_items: int | None = None  # the model's per-request cap; None: no media

    @classmethod
    def of(cls, setting: str, model: ServedModel) -> Truncation:
        """The session's setting ("auto" or "disabled") for its model."""
        return cls(setting == "auto", model.media.limits.max_items_per_request if model.media is not None else None)

    async def chat(
        self, models: ModelRegistry, messages: list[Message], request: Request, *, timeout: float | None
    ) -> Completion:
        """chat's turn of the conversation's messages, or with auto, of the most recent ones that
        fit. When not even the last message fits, chat's error."""
        first = self._least_for_media(messages)
        try:
            return await _turn(models, request(without_oldest(messages, first)), timeout)
        except APIError as exc:
            if not self.auto or exc.code != "context_length_exceeded":
                raise
            overflow = exc
        fitted: Completion | None = None
        lo, hi = first + 1, len(messages) - 1  # leaving out every message leaves no turn to answer
        while lo <= hi:  # the least n in [lo, hi] that fits: each fit found is less than the last
            n = (lo + hi) // 2
            try:
                fitted = await _turn(models, request(without_oldest(messages, n)), timeout)
                hi = n - 1
            except APIError as exc:
                if exc.code != "context_length_exceeded":
                    raise
                lo = n + 1
        if fitted is None:
            raise overflow
        return fitted

    def _least_for_media(self, messages: list[Message]) -> int:
        """With auto, the fewest oldest messages to leave out so the rest hold few enough media items."""
        n = 0
        if self.auto and self.max_media_items is not None:
            while n < len(messages) - 1 and num_media(without_oldest(messages, n)) > self.max_media_items:
                n += 1
        return n


async def _turn(models: ModelRegistry, req: ChatCompletionRequest, timeout: float | None) -> Completion:
    return await chat.chat(models, req, store=None, timeout=timeout, live=True)  # live: a session's turn
