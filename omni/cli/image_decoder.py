"""The image decoder's flags read back, after the device flags are normalised:

    --diffusion-steps, --max-batch-images    at least 1
    --image-step-cache                       0 .. MAX_STEP_CACHE (a usage error, status 2)
    --vision-decoder-replicas R              --vision-decoder-devices must split into R equal groups
    --compile-dit / --no-compile-dit         unset: on where the decoder is on a GPU, off on the CPU
                                             (a few percent there, for tens of seconds of start);
                                             --enforce-eager always off
    --image-guidance-parallel                each replica's layout (omni/engines/worker_specs.py:
                                             DecoderLayout), refused with status 2 where `on` cannot be

A flag that cannot be served raises ImageFlagError; its `usage` says whether it is a usage
error (status 2) or a plain refusal.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from omni.config import ModelConfig, VisionDecoderConfig
from omni.engines.worker_specs import vision_decoder_layout
from omni.serving.requests.images import MAX_STEP_CACHE

log = logging.getLogger("omni.cli.main")


class ImageFlagError(ValueError):
    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


def checked(images: VisionDecoderConfig, *, compile_asked: bool | None, default_device: str, eager: bool) -> VisionDecoderConfig:
    """images with compile_dit decided; default_device: where the decoder runs without
    --vision-decoder-devices (the encoder's device); eager: --enforce-eager."""
    if images.diffusion_steps < 1 or images.max_batch_images < 1:
        raise ImageFlagError("--diffusion-steps and --max-batch-images must be at least 1")
    if not 0 <= images.image_step_cache <= MAX_STEP_CACHE:  # NaN too
        raise ImageFlagError(
            f"--image-step-cache must be between 0 and {MAX_STEP_CACHE:g}, got {images.image_step_cache}", usage=True
        )
    if images.devices and len(images.devices) % images.replicas:
        raise ImageFlagError(
            f"--vision-decoder-replicas {images.replicas}: the {len(images.devices)} --vision-decoder-devices "
            f"({','.join(images.devices)}) cannot be split into {images.replicas} equal groups"
        )
    on_gpu = any(d != "cpu" for d in images.devices) if images.devices else default_device != "cpu"
    return replace(images, compile_dit=(on_gpu if compile_asked is None else compile_asked) and not eager)


def log_layouts(models: tuple[ModelConfig, ...]) -> None:
    """Each image decoder's layout, once at start; ImageFlagError (usage) where it cannot be."""
    for model in models:
        if model.vision_decoder_dir is None:
            continue
        try:
            layout = vision_decoder_layout(model)
        except ValueError as exc:
            raise ImageFlagError(f"{model.name}: {exc}", usage=True) from None
        replicas = model.vision_decoder.replicas
        each = f"{replicas} replicas, each " if replicas > 1 else ""
        log.info("image decoder of %s: %s%s", model.name, each, layout.describe())
