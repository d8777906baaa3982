"""Every output kind the server knows, in the order a model's outputs are built and started: the
one list the layers above iterate (a new output modality adds its kind here, and its chat side).

CHAT_SIDES: how a chat request asks for each kind (omni/modalities/outputs/chat_output.py), in
OUTPUT_KINDS' order; ChatRequest: what they read of the request, all together (the chat
request, omni/serving/requests/chat.py's ChatCompletionRequest, keeps it: mypy checks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from omni.modalities.outputs.audio import AUDIO
from omni.modalities.outputs.audio_chat import AudioRequest, chat_audio
from omni.modalities.outputs.chat_output import ChatModel, ChatOutput
from omni.modalities.outputs.image import IMAGE
from omni.modalities.outputs.image_chat import ImageRequest, chat_images
from omni.modalities.outputs.kind import OutputKind

OUTPUT_KINDS: tuple[OutputKind, ...] = (IMAGE, AUDIO)  # type: ignore[type-arg]


class ChatRequest(ImageRequest, AudioRequest, Protocol):
    """What every chat side reads of a chat request."""


CHAT_SIDES: tuple[Callable[[ChatModel, ChatRequest], ChatOutput | None], ...] = (chat_images, chat_audio)
