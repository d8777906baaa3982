"""Qwen2-VL image preprocessing: decode, smart resize, normalise, cut into patches.

Output matches transformers' Qwen2VLImageProcessor (pixel_values, image_grid_thw) for the
same parameters, and is the input of gpu_workers/models/qwen2_5_vl_vision.py:

    pixel_values  (grid_t*grid_h*grid_w, C*T*P*P) float32, rows in merge-block order:
                  for each frame group t, each merged row, each merged column, the
                  merge x merge patches of that block row-major; each row flattened (C, T, P, P)
    grid_thw      (t, h, w) in patches; a still image is repeated to temporal_patch_size
                  frames, so t == 1

Decoding refuses images whose header declares more than max_decoded_pixels before any
pixel is decompressed (a small PNG can declare a 100k x 100k canvas).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200  # smart_resize's limit, as in the reference


@dataclass(frozen=True, slots=True)
class ImageProcessingConfig:
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    # pixel budget of the resized image (the reference model's values)
    min_pixels: int = 3_136
    max_pixels: int = 2_073_600
    # decompression-bomb guard on the decoded (not resized) image: 8192 x 8192
    max_decoded_pixels: int = 67_108_864
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of factor with min_pixels <= h*w <= max_pixels,
    keeping the aspect ratio as closely as possible (Qwen2-VL's rule, to the rounding)."""
    if min(height, width) <= 0:
        raise ValueError(f"image size {width}x{height} is empty")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"image aspect ratio {width}x{height} exceeds {MAX_ASPECT_RATIO}:1")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(frames: np.ndarray, patch_size: int, temporal_patch_size: int, merge_size: int) -> np.ndarray:
    """frames (T, C, H, W), T a multiple of temporal_patch_size, H and W of patch*merge
    -> (T/tps * H/P * W/P, C*tps*P*P) in merge-block order."""
    t, c, h, w = frames.shape
    gt, gh, gw = t // temporal_patch_size, h // patch_size, w // patch_size
    m, p = merge_size, patch_size
    x = frames.reshape(gt, temporal_patch_size, c, gh // m, m, p, gw // m, m, p)
    # -> (gt, gh/m, gw/m, m, m | c, tps, p, p): block position major, patch content minor
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x).reshape(gt * gh * gw, c * temporal_patch_size * p * p)


def to_rgb(image: Image.Image) -> Image.Image:
    # transparency is composited onto white, as transformers' convert_to_rgb does
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


class ImageProcessor:
    def __init__(self, config: ImageProcessingConfig) -> None:
        self.config = config

    def decode(self, data: bytes) -> Image.Image:
        """Encoded bytes -> RGB image (first frame of an animation); ValueError when the
        bytes are not an image or the declared size exceeds max_decoded_pixels."""
        limit = self.config.max_decoded_pixels
        try:
            image = Image.open(io.BytesIO(data))  # reads the header only
        except Image.DecompressionBombError:
            raise ValueError(f"image exceeds the decoded pixel limit of {limit}") from None
        except (OSError, SyntaxError) as e:  # PIL raises both for unreadable data
            raise ValueError(f"cannot decode image: {e}") from None
        width, height = image.size
        if width * height > limit:
            raise ValueError(f"image is {width}x{height} = {width * height} pixels, over the limit of {limit}")
        try:
            image.load()
        except Image.DecompressionBombError:
            raise ValueError(f"image exceeds the decoded pixel limit of {limit}") from None
        except (OSError, SyntaxError) as e:
            raise ValueError(f"cannot decode image: {e}") from None
        return to_rgb(image)

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        c = self.config
        return smart_resize(height, width, c.factor, c.min_pixels, c.max_pixels)

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """Patch grid of a still image of this decoded size, without preprocessing it
        (what the prompt renderer needs to size an image's placeholder)."""
        h, w = self.resized_size(height, width)
        return 1, h // self.config.patch_size, w // self.config.patch_size

    def normalize(self, image: Image.Image) -> np.ndarray:
        """RGB image -> resized, rescaled and normalised (C, H, W) float32."""
        c = self.config
        image = to_rgb(image)
        h, w = self.resized_size(image.height, image.width)
        if (h, w) != (image.height, image.width):
            image = image.resize((w, h), resample=Image.Resampling.BICUBIC)
        x = np.asarray(image, dtype=np.float32).transpose(2, 0, 1)  # (C, H, W) in [0, 255]
        mean = np.asarray(c.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(c.image_std, dtype=np.float32)[:, None, None]
        return (x * np.float32(1 / 255) - mean) / std

    def preprocess(self, images: list[Image.Image]) -> tuple[torch.Tensor, torch.Tensor]:
        """Images -> pixel_values (sum of t*h*w, C*T*P*P) float32 and grid_thw (num_images, 3)
        int64, images concatenated in order (the vision encoder's packed input)."""
        c = self.config
        patches, grids = [], []
        for image in images:
            x = self.normalize(image)  # (C, H, W)
            # a still image is temporal_patch_size identical frames
            frames = np.broadcast_to(x[None], (c.temporal_patch_size, *x.shape))
            patches.append(patchify(frames, c.patch_size, c.temporal_patch_size, c.merge_size))
            grids.append((1, x.shape[1] // c.patch_size, x.shape[2] // c.patch_size))
        pixel_values = torch.from_numpy(np.concatenate(patches, axis=0))
        return pixel_values, torch.tensor(grids, dtype=torch.int64)
