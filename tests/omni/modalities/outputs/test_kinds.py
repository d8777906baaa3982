"""OUTPUT_KINDS: every kind once, each with its model-side, piece and route types."""

from __future__ import annotations

from typing import get_args

from omni.modalities.outputs.audio import AUDIO, AudioPiece, AudioRoute, ModelAudio
from omni.modalities.outputs.image import IMAGE, GeneratedImage, ImageRoute, ModelImages
from omni.modalities.outputs.kinds import OUTPUT_KINDS
from omni.serving.requests.chat import Modality


def test_every_kind_is_listed_once_with_its_types() -> None:
    assert OUTPUT_KINDS == (IMAGE, AUDIO)
    assert len({k.name for k in OUTPUT_KINDS}) == len(OUTPUT_KINDS)
    assert (IMAGE.output_type, IMAGE.piece_type, IMAGE.route_type) == (ModelImages, GeneratedImage, ImageRoute)
    assert (IMAGE.start_token, AUDIO.start_token) == ("<|discrete_image_start|>", "<|discrete_audio_start|>")
    assert (AUDIO.output_type, AUDIO.piece_type, AUDIO.route_type) == (ModelAudio, AudioPiece, AudioRoute)


def test_a_chat_request_may_name_every_kind_in_modalities() -> None:
    assert get_args(Modality) == ("text", *(k.name for k in OUTPUT_KINDS))
