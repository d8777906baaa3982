"""Output image sizes: the reference's aspect-ratio table, request sizes, and latent grids.

The model opens every image span with a ratio token, `<|vision_ratio_W:H|>`; the reference's
decoder draws it at the size its table gives for that W:H, about 768 x 768 = 589,824 pixels
at that shape, both sides rounded down to a multiple of 16:

    width  = floor(sqrt(768^2 * W/H) / 16) * 16        height = floor(sqrt(768^2 * H/W) / 16) * 16

(e.g. 16:9 -> sqrt(1,048,576) = 1024, sqrt(331,776) = 576). The table below is those values
written out; tests recompute them. W:H is kept as the reference writes it: 6:9 is not 2:3.

A request's explicit `size` must be one of the table's sizes (or "auto": take the size from
the model's ratio token). Why a fixed set and not any multiple of 16: the decoder was trained
at these shapes and draws poorly elsewhere, and batching jobs of one shape together pays only
when shapes repeat. Why multiples of 16 at all: the VAE is 8x, and Flux-style DiTs pack the
latent 2 x 2 into tokens, so a side must divide by 16 to give whole tokens (the reference
asserts it too).
"""

from __future__ import annotations

import math
import re

AUTO = "auto"
VAE_SCALE = 8  # pixels per latent pixel, each way
PATCH_SCALE = 16  # pixels per 2 x 2-packed DiT token, each way
TARGET_PIXELS = 768 * 768

# "W:H" -> (width, height), in the reference's order: its ratios, then their inverses
RATIO_SIZES: dict[str, tuple[int, int]] = {
    "1:1": (768, 768),
    "1:2": (528, 1072),
    "3:4": (656, 880),
    "3:5": (592, 976),
    "4:5": (672, 848),
    "6:9": (624, 928),
    "9:16": (576, 1024),
    "2:1": (1072, 528),
    "4:3": (880, 656),
    "5:3": (976, 592),
    "5:4": (848, 672),
    "9:6": (928, 624),
    "16:9": (1024, 576),
}
ALLOWED_SIZES: tuple[str, ...] = (AUTO, *(f"{w}x{h}" for w, h in RATIO_SIZES.values()))

_RATIO_TOKEN = re.compile(r"^<\|vision_ratio_(\d+):(\d+)\|>$")
_SIZE = re.compile(r"^(\d+)x(\d+)$")


def size_for_ratio(ratio: str) -> tuple[int, int]:
    """(width, height) for "W:H"; ValueError for a ratio the table lacks."""
    size = RATIO_SIZES.get(ratio)
    if size is None:
        raise ValueError(f"aspect ratio {ratio!r} is not in the size table ({', '.join(RATIO_SIZES)})")
    return size


def nearest_size(width: int, height: int) -> tuple[int, int]:
    """The table's size for the ratio W:H, else the size whose aspect is nearest (a ratio token
    the table lacks is still drawn, at the closest shape the decoder knows)."""
    exact = RATIO_SIZES.get(f"{width}:{height}")
    if exact is not None:
        return exact
    aspect = math.log(width / height)
    return min(RATIO_SIZES.values(), key=lambda size: abs(math.log(size[0] / size[1]) - aspect))


def size_for_ratio_token(token: str) -> tuple[int, int]:
    """(width, height) for a ratio token such as "<|vision_ratio_16:9|>"."""
    match = _RATIO_TOKEN.match(token)
    if match is None:
        raise ValueError(f"{token!r} is not a ratio token <|vision_ratio_W:H|>")
    return size_for_ratio(f"{match[1]}:{match[2]}")


def parse_size(size: str) -> tuple[int, int] | None:
    """A request's size "WIDTHxHEIGHT" -> (width, height); "auto" -> None (the ratio token
    decides). Anything outside ALLOWED_SIZES is a ValueError whose message lists them."""
    if size == AUTO:
        return None
    match = _SIZE.match(size) if isinstance(size, str) else None
    if match is None:
        raise ValueError(f"size {size!r} is not 'auto' or WIDTHxHEIGHT; supported: {', '.join(ALLOWED_SIZES)}")
    width, height = int(match[1]), int(match[2])
    if f"{width}x{height}" not in ALLOWED_SIZES:
        raise ValueError(f"size {size!r} is not supported; supported: {', '.join(ALLOWED_SIZES)}")
    return width, height


def latent_grid(width: int, height: int) -> tuple[int, int]:
    """(rows, cols) of the VAE latent, 8x smaller: 768 x 768 -> (96, 96)."""
    return _grid(width, height, VAE_SCALE)


def token_grid(width: int, height: int) -> tuple[int, int]:
    """(rows, cols) of 2 x 2-packed DiT tokens, 16x smaller: 768 x 768 -> (48, 48). The
    reference's DiT runs unpacked (one token per latent pixel, latent_grid) by default."""
    return _grid(width, height, PATCH_SCALE)


def _grid(width: int, height: int, scale: int) -> tuple[int, int]:
    if width <= 0 or height <= 0 or width % scale or height % scale:
        raise ValueError(f"image {width}x{height}: both sides must be positive multiples of {scale}")
    return height // scale, width // scale
