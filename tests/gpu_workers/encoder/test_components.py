"""The encoder worker's components on the tiny per-component checkpoint: one class per name,
what each takes from its folder, how it prepares an item (and refuses one), what an item costs
and how a batch is cut by it, and one output per item from a forward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from gpu_workers.encoder.component_files import DirFiles
from gpu_workers.encoder.components import (
    COMPONENTS,
    AudioEncoderComponent,
    AudioTokenizerComponent,
    Component,
    ImageTokenizerComponent,
    VisionEncoderComponent,
    _triple,
    forward_groups,
)
from gpu_workers.tiny.checkpoints import TINY_AUDIO_LEVELS, TINY_IMAGE_CODEBOOK, make_tiny_component_checkpoint

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_component_checkpoint(tmp_path_factory.mktemp("components") / "model")


@pytest.fixture(scope="module")
def built(root: Path) -> dict[str, Component]:
    return {name: Component.create(name, DirFiles(root / name), CPU, torch.float32) for name in COMPONENTS}


def test_each_name_builds_its_class(built: dict[str, Component]) -> None:
    assert {name: type(c) for name, c in built.items()} == {
        "vision_encoder": VisionEncoderComponent,
        "audio_encoder": AudioEncoderComponent,
        "image_tokenizer": ImageTokenizerComponent,
        "audio_tokenizer": AudioTokenizerComponent,
    }
    assert {name: (sorted(c.kinds), c.discrete) for name, c in built.items()} == {
        "vision_encoder": (["image", "video"], False),
        "audio_encoder": (["audio"], False),
        "image_tokenizer": (["image"], True),
        "audio_tokenizer": (["audio"], True),
    }


class _Costly(Component):
    max_forward_cost = 6

    def __init__(self) -> None:  # no files: only cost() is asked
        pass

    def cost(self, prepared: Any) -> int:
        return int(prepared)

    def prepare(self, kind: str, media: Any) -> Any:
        return media

    def forward(self, prepared: list[Any]) -> list[torch.Tensor]:
        return []


def test_a_batch_is_cut_in_order_into_runs_within_the_cost_bound() -> None:
    # 3 | 4+2 = 6 | 10 (over the bound: alone) | 1
    assert forward_groups(_Costly(), [3, 4, 2, 10, 1]) == [[0], [1, 2], [3], [4]]
    assert forward_groups(_Costly(), []) == []


def test_per_channel_values_are_three_numbers() -> None:
    assert _triple([1, 0.5, "0.25"]) == (1.0, 0.5, 0.25)
    with pytest.raises(ValueError, match=r"want three per-channel values, got \[1, 2\]"):
        _triple([1, 2])


def test_the_vision_encoder_reads_its_preprocessor_config(built: dict[str, Component]) -> None:
    vision = built["vision_encoder"]
    assert isinstance(vision, VisionEncoderComponent)
    p = vision.processor.config
    assert (p.min_pixels, p.max_pixels, p.patch_size, p.merge_size) == (3_136, 12_544, 14, 2)
    assert (vision.video.max_pixels_per_frame, vision.video.min_frames, vision.video.frames_per_chunk) == (3_136, 4, 32)


def test_an_image_and_a_video_become_patches_and_grids(built: dict[str, Component]) -> None:
    vision = built["vision_encoder"]
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (60, 100, 3), dtype=np.uint8))
    patches, grids = vision.prepare("image", image)
    # 60 x 100 rounds to 56 x 112 (multiples of 28, within the budget): 4 x 8 patches
    assert (patches.shape, grids, vision.cost((patches, grids))) == ((32, 1176), [(1, 4, 8)], 32)
    frames = [np.full((40, 40, 3), i * 50, dtype=np.uint8) for i in range(3)]
    patches, grids = vision.prepare("video", frames)
    # 3 frames repeat the last up to min_frames 4: 2 temporal patches; 40 x 40 scales up to 56 x 56
    assert (patches.shape, grids) == ((32, 1176), [(2, 4, 4)])
    out = vision.forward([vision.prepare("image", image), (patches, grids)])
    assert [tuple(t.shape) for t in out] == [(8, 64), (8, 64)]  # 2 x 2 patches merge into a row


def test_the_largest_forward_costs_the_bound(built: dict[str, Component]) -> None:
    vision, audio = built["vision_encoder"], built["audio_encoder"]
    (largest,) = vision.largest_forward()
    assert largest[1] == [(1, 256, 256)] and vision.cost(largest) == vision.max_forward_cost == 65_536
    assert [audio.cost(w) for w in audio.largest_forward()] == [audio.max_forward_cost] == [9_600_000]
    assert built["image_tokenizer"].largest_forward() is None


def test_audio_is_a_float32_waveform_and_empty_audio_is_refused(built: dict[str, Component]) -> None:
    audio = built["audio_encoder"]
    wave = audio.prepare("audio", [0, 1, 2])
    assert wave.dtype == np.float32 and wave.tolist() == [0.0, 1.0, 2.0] and audio.cost(wave) == 3
    with pytest.raises(ValueError, match="^the audio is empty$"):
        audio.prepare("audio", [])


def test_each_audio_clip_gets_its_own_rows_and_units(built: dict[str, Component]) -> None:
    rng = np.random.default_rng(1)
    clips = [rng.standard_normal(16_000).astype(np.float32), rng.standard_normal(8_000).astype(np.float32)]
    rows = built["audio_encoder"].forward(clips)
    # 100 and 50 valid frames; the conv halves them, (n - 1) // 2 + 1, and the pooling again, (n - 2) // 2 + 1
    assert [tuple(r.shape) for r in rows] == [(25, 64), (12, 64)]
    units = built["audio_tokenizer"].forward(clips)
    assert all(
        u.dtype == torch.int64 and 0 <= int(u.min()) and int(u.max()) < np.prod(TINY_AUDIO_LEVELS) for u in units
    )
    assert len(units[0]) > len(units[1]) > 0


def test_the_image_tokenizer_gives_codes_of_its_codebook(built: dict[str, Component]) -> None:
    tokenizer = built["image_tokenizer"]
    rgba = Image.new("RGBA", (30, 20), (0, 0, 0, 0))
    assert tokenizer.prepare("image", rgba).mode == "RGB"
    codes = tokenizer.forward([tokenizer.prepare("image", rgba), Image.new("RGB", (50, 50), (200, 10, 10))])
    assert len(codes) == 2 and codes[0].shape == codes[1].shape and codes[0].dtype == torch.int64
    assert 0 <= int(torch.cat(codes).min()) and int(torch.cat(codes).max()) < TINY_IMAGE_CODEBOOK
