"""An output kind as a chat turn gets it: its chat side. Chat (omni/serving/chat.py and
omni/http/handlers/chat.py) names no kind; it asks each kind's chat side, in OUTPUT_KINDS'
order (omni/modalities/outputs/kinds.py CHAT_SIDES), and loops over what they give:

    ask       (served model, chat request) -> a ChatOutput, or None: the request's choices
              cannot make the kind (a 400 when it asks for a kind the model lacks)
    ChatOutput  one request's options for the kind (image: size, steps, seed; audio: voice,
              format): the spans its choices are held to, each choice's route, and a ChatBody
    ChatBody  the kind's part of one response's body, in OpenAI's shape for it: content parts
              after the text (images), or a field of its own that the text becomes the
              transcript of (message.audio), in the message and in each stream chunk

The image's is omni/modalities/outputs/image_chat.py, the audio's omni/modalities/outputs/audio_chat.py;
each declares the Protocol of what it reads of the request (kinds.py joins them: ChatRequest).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from omni.engines.generation import Delta
from omni.engines.pool import ModelPool
from omni.modalities.outputs.kind import Carrier, ModelOutput, OutputKind, OutputSpans
from omni.modalities.outputs.router import SpanRoute
from omni.text.chat_format import ChatFormat
from omni.text.tokenizer import TextTokenizer
from scheduler.request import SamplingParams

M = TypeVar("M", bound=ModelOutput)


class ChatModel(Protocol):
    """What a chat side reads of the served model (omni/serving/model.py ServedModel)."""

    @property
    def tokenizer(self) -> TextTokenizer: ...

    @property
    def pool(self) -> ModelPool: ...

    @property
    def chat_format(self) -> ChatFormat: ...

    def output(self, kind: OutputKind[M, Any]) -> M | None: ...


class ChatBody(Protocol):
    """One output kind's part in one chat response's body. Fields are the body's own names
    (ChatCompletionMessage's, ChunkDelta's in omni/serving/bodies.py), set as given."""

    def spoke(self, index: int, carrier: Carrier) -> bool:
        """The choice's text is the transcript of what the kind made so far (the reply parser
        then reads the spoken markup as said); carrier: the collected choice, or a stream's
        latest Delta."""
        ...

    def parts(self, carrier: Carrier) -> list[Any]:
        """Content parts that follow the text: a message's (the collected choice), or a chunk's
        of their own (a stream's Delta); none when the kind makes none there."""
        ...

    async def message(self, carrier: Carrier, text: str) -> dict[str, Any]:
        """The message fields the kind fills for a collected choice whose content is text."""
        ...

    def delta(self, index: int, delta: Delta, content: str) -> dict[str, Any]:
        """The fields of a stream chunk's delta the kind fills, for choice index's Delta whose
        parsed content is content; none when the chunk carries nothing of it."""
        ...

    async def finish(self) -> None:
        """The stream ended (every choice's last chunk sent)."""
        ...

    def count(self, carrier: Carrier) -> None:
        """A collected choice, or a stream's Delta: what it made counts in the usage."""
        ...

    def usage(self) -> dict[str, Any]:
        """The usage fields (Usage's own names) the kind fills for all count() saw; none when
        it fills none."""
        ...


class ChatOutput(Protocol):
    """One output kind as a chat request gets it."""

    def spans(self) -> OutputSpans | None:
        """The span grammar its choices are held to where they open a span (None: not compiled)."""
        ...

    def answer_format(self) -> ChatOutput | None:
        """What is left of it under an answer format (None: nothing)."""
        ...

    def within(self, params: SamplingParams) -> tuple[ChatOutput, SamplingParams]:
        """The text's params, with what the kind keeps of max_tokens for itself taken out."""
        ...

    def with_previews(self, partial_images: int, previews: asyncio.Queue[Any]) -> ChatOutput:
        """Each piece it makes puts partial_images previews on the queue first, where the kind
        makes previews (an image's ImagePreview, its choice's index as its image)."""
        ...

    def call_rules(self) -> Sequence[str]:
        """Grammar rules a tool call's argument may embed a span by (tool_call_grammar's)."""
        ...

    def route(self, model: ChatModel, choice_index: int) -> SpanRoute: ...

    def body(self, choices: int) -> ChatBody:
        """Its part of the body of the response to this request's choices."""
        ...

