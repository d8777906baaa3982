"""OUTPUT_KINDS: every kind once, each with its model-side, piece and route types, and its chat
side in CHAT_SIDES, in the same order."""

from __future__ import annotations

from typing import get_args

from omni.modalities.outputs.audio import AUDIO, AudioPiece, AudioRoute, ModelAudio
from omni.modalities.outputs.audio_chat import chat_audio
from omni.modalities.outputs.image import IMAGE, GeneratedImage, ImageRoute, ModelImages
from omni.modalities.outputs.image_chat import chat_images
from omni.modalities.outputs.kinds import CHAT_SIDES, OUTPUT_KINDS
from omni.serving.requests.chat import Modality


def test_every_kind_is_listed_once_with_its_types() -> None:
    assert OUTPUT_KINDS == (IMAGE, AUDIO)
    assert len({k.name for k in OUTPUT_KINDS}) == len(OUTPUT_KINDS)
    assert (IMAGE.output_type, IMAGE.piece_type, IMAGE.route_type) == (ModelImages, GeneratedImage, ImageRoute)
    assert (IMAGE.start_token, AUDIO.start_token) == ("<|discrete_image_start|>", "<|discrete_audio_start|>")
    assert (AUDIO.output_type, AUDIO.piece_type, AUDIO.route_type) == (ModelAudio, AudioPiece, AudioRoute)


def test_a_chat_request_may_name_every_kind_in_modalities() -> None:
    assert get_args(Modality) == ("text", *(k.name for k in OUTPUT_KINDS))


def test_each_kind_has_its_chat_side_in_the_kinds_order() -> None:
    assert CHAT_SIDES == (chat_images, chat_audio)
    assert len(CHAT_SIDES) == len(OUTPUT_KINDS)
