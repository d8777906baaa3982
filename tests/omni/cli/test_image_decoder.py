"""The image decoder's flags checked on their own (omni/cli/image_decoder.py); through the
whole command line they are tests/omni/cli/test_options.py's."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from omni.cli.image_decoder import ImageFlagError, checked, log_layouts
from omni.config import ModelConfig, VisionDecoderConfig


def test_the_dit_is_compiled_where_the_decoder_is_on_a_gpu_unless_told() -> None:
    def compiled(images: VisionDecoderConfig, asked: bool | None = None, device: str = "cpu", eager: bool = False) -> bool:
        return checked(images, compile_asked=asked, default_device=device, eager=eager).compile_dit

    plain, on_gpus = VisionDecoderConfig(), VisionDecoderConfig(devices=("cuda:1", "cuda:2"))
    assert not compiled(plain) and compiled(plain, device="cuda:0") and compiled(on_gpus)
    assert compiled(plain, asked=True) and not compiled(on_gpus, asked=False)
    assert not compiled(on_gpus, asked=True, eager=True)


@pytest.mark.parametrize(
    ("images", "says", "usage"),
    [
        (VisionDecoderConfig(diffusion_steps=0), "--diffusion-steps and --max-batch-images must be at least 1", False),
        (VisionDecoderConfig(image_step_cache=-1.0), "--image-step-cache must be between 0 and", True),
        (VisionDecoderConfig(image_step_cache=float("nan")), "--image-step-cache must be between 0 and", True),
        (VisionDecoderConfig(devices=("cpu",) * 3, replicas=2), "the 3 --vision-decoder-devices (cpu,cpu,cpu) cannot be split into 2", False),
    ],
)
def test_flags_that_cannot_be_served_are_refused(images: VisionDecoderConfig, says: str, usage: bool) -> None:
    with pytest.raises(ImageFlagError) as info:
        checked(images, compile_asked=None, default_device="cpu", eager=False)
    assert says in str(info.value) and info.value.usage == usage


def test_each_decoders_layout_is_logged_with_its_replicas(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    decoder = tmp_path / "vision_decoder"
    decoder.mkdir()
    (decoder / "config.json").write_text('{"guidance": "autoguidance"}')
    model = ModelConfig(
        name="m", model_dir=tmp_path, vision_decoder_dir=decoder,
        vision_decoder=VisionDecoderConfig(devices=("cpu",) * 4, replicas=2),
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="omni.cli.main"):
        log_layouts((model, ModelConfig(name="text", model_dir=tmp_path)))
    assert [r.getMessage() for r in caplog.records] == [
        "image decoder of m: 2 replicas, each 2 devices = 2 guidance groups (transformer | transformer2) x 1 Ulysses rank"
    ]
    on = ModelConfig(name="m", model_dir=tmp_path, vision_decoder_dir=decoder,
                     vision_decoder=VisionDecoderConfig(devices=("cpu",) * 3, guidance_parallel="on"))  # fmt: skip
    with pytest.raises(ImageFlagError, match="m: --image-guidance-parallel on: --vision-decoder-devices names 3 devices"):
        log_layouts((on,))
