"""Worker specs from a model's config: each component's dtype (named, the LLM's --dtype, the
vocoder's float32, auto per device, the VAE's float16 upcast), the devices each worker lands on,
the image decoder's layout (guidance groups x Ulysses ranks), and which workers open the
artifact store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from omni.config import (
    AudioDecoderConfig,
    EncoderConfig,
    LLMConfig,
    ModelConfig,
    StoreConfig,
    VisionDecoderConfig,
    WorkerConfig,
)
from omni.engines.worker_specs import (
    audio_decoder_worker_spec,
    component_dtype,
    decoder_layout,
    encoder_worker_spec,
    llm_worker_spec,
    vision_decoder_worker_spec,
    vision_decoder_worker_specs,
)
from omni.shared import protocol


@pytest.mark.parametrize(
    ("worker", "component", "device", "dtype"),
    [
        (WorkerConfig(component_dtype=("vae=bfloat16", "llm=float16")), "llm", "cpu", "float16"),  # named wins
        (WorkerConfig(dtype="bfloat16", requested_dtype="bfloat16"), "llm", "cpu", "bfloat16"),
        (WorkerConfig(dtype="bfloat16", requested_dtype="bfloat16"), "vocoder", "cuda:0", "float32"),
        (WorkerConfig(), "encoder", "cpu", "float32"),  # auto: by the component's own device
        (WorkerConfig(), "encoder", "cuda:1", "bfloat16"),
        (WorkerConfig(requested_dtype="float16"), "vae", "cuda:0", "float32"),  # float16 VAE overflows
        (WorkerConfig(requested_dtype="float16"), "vision_decoder", "cuda:0", "float16"),
        (WorkerConfig(component_dtype=("vocoder=bfloat16",)), "vocoder", "cuda:0", "bfloat16"),
    ],
)
def test_a_components_dtype(worker: WorkerConfig, component: str, device: str, dtype: str) -> None:
    assert component_dtype(worker, component, device) == dtype


def omni_model(**parts: object) -> ModelConfig:
    return ModelConfig(
        name="m",
        model_dir=Path("/ckpt/llm"),
        encoder_dir=Path("/ckpt"),
        vision_decoder_dir=Path("/ckpt/vd"),
        audio_decoder_dir=Path("/ckpt/ad"),
        worker=WorkerConfig(num_threads=3, seed=11),
        llm=LLMConfig(devices=("cuda:0", "cuda:1"), block_size=32, max_num_seqs=8, max_num_batched_tokens=1024),
        store=StoreConfig(location="s3://bucket/p", endpoint_url="http://minio", region="eu"),
        **parts,  # type: ignore[arg-type]
    )


def test_an_omni_models_llm_workers_open_the_store_and_a_text_models_do_not() -> None:
    spec = llm_worker_spec(omni_model(), 1, "cuda:1")
    assert (spec.worker_id, spec.device, spec.model_dir, spec.block_size, spec.max_num_seqs) == (1, "cuda:1", "/ckpt/llm", 32, 8)
    assert (spec.num_threads, spec.seed, spec.profile_tokens) == (3, 11, 1024)
    assert spec.store == protocol.StoreSettings("s3://bucket/p", "http://minio", "eu")
    text = ModelConfig(name="t", model_dir=Path("/t"))
    assert llm_worker_spec(text, 0, "cpu").store is None


def test_the_encoder_and_the_decoders_follow_the_first_llm_device_unless_placed() -> None:
    model = omni_model()
    encoder = encoder_worker_spec(model, "cuda:0")
    assert (encoder.model_dir, encoder.store.location, encoder.seed) == ("/ckpt", "s3://bucket/p", 11)
    audio = audio_decoder_worker_spec(model)
    assert (audio.device, audio.dtype, audio.model_dir) == ("cuda:0", "float32", "/ckpt/ad")
    vision = vision_decoder_worker_spec(model)
    assert (vision.device, vision.world_size, vision.rank_devices, vision.dtype, vision.vae_dtype) == ("cuda:0", 1, [], "bfloat16", "bfloat16")


def test_placed_decoders_land_where_they_are_told() -> None:
    model = omni_model(
        encoder=EncoderConfig(device="cuda:2"),
        audio_decoder=AudioDecoderConfig(device="cpu"),
        vision_decoder=VisionDecoderConfig(devices=("cuda:2", "cuda:3")),
    )
    assert audio_decoder_worker_spec(model).device == "cpu"
    vision = vision_decoder_worker_spec(model)
    assert (vision.device, vision.world_size, vision.rank_devices) == ("cuda:2", 2, ["cuda:2", "cuda:3"])
    moved = omni_model(encoder=EncoderConfig(device="cuda:2"))
    assert (audio_decoder_worker_spec(moved).device, vision_decoder_worker_spec(moved).device) == ("cuda:2", "cuda:2")


def test_replicas_split_the_decoder_devices_into_equal_groups() -> None:
    model = omni_model(vision_decoder=VisionDecoderConfig(devices=("cuda:2", "cuda:3", "cuda:4", "cuda:5"), replicas=2))
    specs = vision_decoder_worker_specs(model)
    assert [(s.worker_id, s.device, s.world_size, s.rank_devices) for s in specs] == [
        (0, "cuda:2", 2, ["cuda:2", "cuda:3"]),
        (1, "cuda:4", 2, ["cuda:4", "cuda:5"]),
    ]
    unplaced = vision_decoder_worker_specs(omni_model(vision_decoder=VisionDecoderConfig(replicas=3)))
    assert [(s.worker_id, s.device, s.world_size) for s in unplaced] == [(0, "cuda:0", 1), (1, "cuda:0", 1), (2, "cuda:0", 1)]


@pytest.mark.parametrize(
    ("devices", "flag", "guidance", "groups"),
    [
        (2, "auto", "autoguidance", 2),
        (4, "auto", "cfg", 2),
        (6, "on", "autoguidance", 2),
        (3, "auto", "autoguidance", 1),  # odd: one Ulysses group of every device
        (1, "auto", "cfg", 1),
        (2, "auto", "none", 1),  # one pass a step: nothing to split
        (4, "off", "autoguidance", 1),
        (5, "off", "none", 1),
    ],
)
def test_the_image_decoders_devices_split_in_guidance_groups_of_ulysses_ranks(
    devices: int, flag: str, guidance: str, groups: int
) -> None:
    layout = decoder_layout(devices, flag, guidance)
    assert (layout.guidance_groups, layout.ulysses_ranks) == (groups, devices // groups)
    assert layout.guidance_groups * layout.ulysses_ranks == devices  # every device is one rank


@pytest.mark.parametrize(
    ("devices", "guidance", "says"),
    [(3, "autoguidance", "names 3 devices; guidance parallelism needs 2 x N"), (1, "cfg", "names 1 device;"),
     (2, "none", "has no guidance")],
)  # fmt: skip
def test_guidance_parallelism_on_refuses_a_layout_it_cannot_have(devices: int, guidance: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        decoder_layout(devices, "on", guidance)
