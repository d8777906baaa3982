"""ServedModel: its output modalities are one tuple, and workers() is every worker it owns in
the order the app starts them (encoders first, the LLM workers last)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

from omni.engines.audio_decoder import AudioDecoderEngine
from omni.engines.encoder import EncoderEngine
from omni.engines.llm import LLMEngine
from omni.engines.pool import ModelPool
from omni.engines.supervisor import SupervisedWorker
from omni.engines.vision_decoder import VisionDecoderEngine
from omni.engines.vision_replicas import VisionDecoderReplicas
from omni.metrics import Metrics
from omni.modalities.inputs.pipeline import MediaPipeline
from omni.modalities.outputs.audio import AUDIO, ModelAudio
from omni.modalities.outputs.image import IMAGE, ModelImages
from omni.serving.model import ModelRegistry, ServedModel
from omni.shared.store.base import ArtifactStore
from omni.text.constrained.audio_span import AudioSpanFormat
from omni.text.constrained.image_span import ImageSpanFormat
from omni.text.tokenizer import TextTokenizer


def test_workers_are_the_encoder_the_output_decoders_then_the_llm_workers(tiny_tokenizer_dir: Path) -> None:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    encoder, voice = cast(EncoderEngine, "encoder"), cast(AudioDecoderEngine, "voice")
    drawer = cast(VisionDecoderReplicas, SimpleNamespace(workers=("drawer 0", "drawer 1")))
    llms = [cast(LLMEngine, "llm 0"), cast(LLMEngine, "llm 1")]
    store = cast(ArtifactStore, None)
    image_fmt, audio_fmt = ImageSpanFormat.from_tokenizer(tokenizer, 2, 3), AudioSpanFormat.from_tokenizer(tokenizer)
    assert image_fmt is not None and audio_fmt is not None
    images = ModelImages(drawer, image_fmt, store, Metrics())
    audio = ModelAudio(voice, audio_fmt, store)
    model = ServedModel(
        "m", tokenizer, cast(ModelPool, SimpleNamespace(engines=llms)), created=0,
        media=cast(MediaPipeline, SimpleNamespace(encoder=encoder)), outputs=(images, audio),
    )  # fmt: skip
    assert model.workers() == cast(tuple[SupervisedWorker, ...], ("encoder", "drawer 0", "drawer 1", "voice", "llm 0", "llm 1"))
    assert model.output(IMAGE) is images and model.output(AUDIO) is audio
    assert model.kinds == [(IMAGE, images), (AUDIO, audio)]

    text_only = ServedModel("t", tokenizer, cast(ModelPool, SimpleNamespace(engines=llms[:1])), created=0)
    assert text_only.workers() == cast(tuple[SupervisedWorker, ...], ("llm 0",))
    assert text_only.output(IMAGE) is None and text_only.output(AUDIO) is None and text_only.kinds == []


def test_only_the_llm_worker_sizes_itself_from_free_memory() -> None:
    assert LLMEngine.sizes_from_free_memory
    assert not any(w.sizes_from_free_memory for w in (EncoderEngine, VisionDecoderEngine, AudioDecoderEngine))


def test_a_model_is_known_by_its_name_and_aliases_and_no_other_model_s() -> None:
    one, other = cast(ServedModel, SimpleNamespace(name="omni")), cast(ServedModel, SimpleNamespace(name="text"))
    registry = ModelRegistry()
    registry.add(one, ("gpt-realtime", "voice"))
    registry.add(other, ("t",))
    assert registry.names(one) == ["omni", "gpt-realtime", "voice"]
    assert registry.names(other) == ["text", "t"]
