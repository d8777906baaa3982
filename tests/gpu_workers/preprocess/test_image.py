"""Images for the Qwen2.5-VL vision encoder: decoding with its limits, Qwen2-VL's resize rule,
the patch layout and the whole preprocessing, each against transformers' image processor."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_proc

from gpu_workers.preprocess.image import ImageProcessingConfig, ImageProcessor, patchify, smart_resize, to_rgb


@pytest.mark.parametrize(
    "size",
    [(1, 1), (20, 30), (56, 56), (73, 101), (480, 640), (1080, 1920), (4000, 3000), (100, 19000)],
)
@pytest.mark.parametrize("pixels", [(3_136, 2_073_600), (3_136, 15_680)])
def test_smart_resize_matches_transformers(size: tuple[int, int], pixels: tuple[int, int]) -> None:
    if max(size) / min(size) > 200:
        with pytest.raises(ValueError, match="aspect ratio"):
            smart_resize(*size, 28, *pixels)
        return
    assert smart_resize(*size, 28, *pixels) == hf_proc.smart_resize(*size, 28, *pixels)


def test_patch_layout_matches_transformers() -> None:
    image = np.random.default_rng(5).standard_normal((3, 56, 84)).astype(np.float32)
    want, gh, gw = hf_proc.Qwen2VLImageProcessorPil().patchify(image, 14, 2, 2)
    got = patchify(np.broadcast_to(image[None], (2, *image.shape)), 14, 2, 2)
    assert (gh, gw) == (4, 6)
    assert np.array_equal(got, want)


def random_image(width: int, height: int, mode: str, seed: int) -> Image.Image:
    channels = len(mode)
    data = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(data if channels > 1 else data[..., 0], mode=mode)


def test_preprocess_matches_transformers() -> None:
    # one upscaled past min_pixels, one downscaled under max_pixels, one with alpha
    images = [random_image(37, 45, "RGB", 6), random_image(160, 121, "RGB", 7), random_image(60, 90, "RGBA", 8)]
    config = ImageProcessingConfig(min_pixels=3_136, max_pixels=12_544)
    got_pixels, got_grid = ImageProcessor(config).preprocess(images)
    hf = hf_proc.Qwen2VLImageProcessorPil(
        min_pixels=3_136, max_pixels=12_544, patch_size=14, temporal_patch_size=2, merge_size=2
    )
    want = hf(images=images, return_tensors="np")
    assert got_grid.tolist() == want["image_grid_thw"].tolist()
    assert got_pixels.shape == want["pixel_values"].shape
    assert np.abs(got_pixels.numpy() - want["pixel_values"]).max() < 1e-5


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_decode_rejects_pixel_bombs_and_garbage() -> None:
    processor = ImageProcessor(ImageProcessingConfig(max_decoded_pixels=1_000))
    decoded = processor.decode(png_bytes(random_image(25, 40, "RGBA", 9)))
    assert (decoded.size, decoded.mode) == ((25, 40), "RGB")
    with pytest.raises(ValueError, match="limit of 1000"):
        processor.decode(png_bytes(random_image(40, 26, "RGB", 10)))
    with pytest.raises(ValueError, match="cannot decode"):
        processor.decode(b"not an image")


def test_to_rgb_composites_transparency_onto_white() -> None:
    rgba = Image.new("RGBA", (2, 1))
    rgba.putpixel((0, 0), (10, 20, 30, 255))
    rgba.putpixel((1, 0), (10, 20, 30, 0))  # fully transparent: white
    assert [to_rgb(rgba).getpixel((x, 0)) for x in range(2)] == [(10, 20, 30), (255, 255, 255)]
    gray = Image.new("L", (1, 1), 7)
    assert (to_rgb(gray).mode, to_rgb(gray).getpixel((0, 0))) == ("RGB", (7, 7, 7))
    rgb = Image.new("RGB", (1, 1))
    assert to_rgb(rgb) is rgb


def test_the_grid_is_the_resized_size_in_patches() -> None:
    processor = ImageProcessor(ImageProcessingConfig(min_pixels=3_136, max_pixels=12_544))
    # 45 x 37 rounds to 56 x 28, under min_pixels: scaled by sqrt(3136 / (45 * 37)), then up to 28s
    assert processor.resized_size(45, 37) == (84, 56)
    assert processor.grid_thw(45, 37) == (1, 6, 4)
    # 121 x 160 rounds to 112 x 168, over max_pixels: scaled by sqrt(12544 / (121 * 160)), down to 28s
    assert processor.grid_thw(121, 160) == (1, 6, 8)
    with pytest.raises(ValueError, match="image size 0x10 is empty"):
        processor.grid_thw(10, 0)
