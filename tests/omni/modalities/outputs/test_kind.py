"""OutputKind: the kinds' pieces ride on a Delta under their names, typed; the ban rule reads
modalities; a model's object of a kind is found among its outputs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from omni.engines.generation import Delta
from omni.modalities.outputs.audio import AUDIO, AudioPiece, ModelAudio
from omni.modalities.outputs.image import IMAGE, GeneratedImage, ModelImages


def test_pieces_ride_on_the_delta_by_kind() -> None:
    delta = Delta("", [])
    image, chunk = GeneratedImage("u", 1, 1), AudioPiece(b"", 24000, 0)
    IMAGE.add(delta, image)
    AUDIO.add(delta, chunk)
    AUDIO.add(delta, chunk)
    assert delta.pieces == {"image": [image], "audio": [chunk, chunk]}
    assert IMAGE.pieces(delta) == [image] and AUDIO.pieces(delta) == [chunk, chunk]
    assert IMAGE.pieces(Delta("", [])) == []


def test_the_ban_rule_reads_modalities() -> None:
    assert IMAGE.allowed(None) and IMAGE.allowed(["text", "image"])
    assert not IMAGE.allowed(["text"]) and not AUDIO.allowed(["text", "image"])
    # audio only when modalities asks, as OpenAI's chat answers; an image the model draws unasked
    assert not AUDIO.allowed(None) and AUDIO.allowed(["text", "audio"])


def test_a_kind_finds_its_object_among_a_models_outputs() -> None:
    images = cast(ModelImages, object.__new__(ModelImages))
    audio = cast(ModelAudio, object.__new__(ModelAudio))
    assert IMAGE.of((audio, images)) is images and AUDIO.of((audio, images)) is audio
    assert IMAGE.of(()) is None
    fmt = SimpleNamespace(start_token_id=7)
    assert IMAGE.opener(cast(Any, SimpleNamespace(format=fmt))) == 7
