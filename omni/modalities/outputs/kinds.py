"""Every output kind the server knows, in the order a model's outputs are built and started: the
one list the layers above iterate (a new output modality adds its kind here, and its chat side).

CHAT_SIDES: how a chat request asks for each kind (omni/modalities/outputs/chat_output.py), in
OUTPUT_KINDS' order."""

from __future__ import annotations

from omni.modalities.outputs.audio import AUDIO
from omni.modalities.outputs.audio_chat import chat_audio
from omni.modalities.outputs.chat_output import Ask
from omni.modalities.outputs.image import IMAGE
from omni.modalities.outputs.image_chat import chat_images
from omni.modalities.outputs.kind import OutputKind

OUTPUT_KINDS: tuple[OutputKind, ...] = (IMAGE, AUDIO)  # type: ignore[type-arg]
CHAT_SIDES: tuple[Ask, ...] = (chat_images, chat_audio)
