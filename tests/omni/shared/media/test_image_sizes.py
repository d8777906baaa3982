from __future__ import annotations

import math

import pytest

from gpu_workers.tiny.tokenizer import SPECIAL_TOKENS
from omni.shared.media.image_sizes import (
    ALLOWED_SIZES,
    RATIO_SIZES,
    TARGET_PIXELS,
    latent_grid,
    parse_size,
    size_for_ratio,
    size_for_ratio_token,
    token_grid,
)

# the brief's list, written independently of the module's table
EXPECTED = {
    "1:1": (768, 768),
    "3:4": (656, 880),
    "9:16": (576, 1024),
    "1:2": (528, 1072),
    "3:5": (592, 976),
    "4:5": (672, 848),
    "6:9": (624, 928),
    "4:3": (880, 656),
    "16:9": (1024, 576),
    "2:1": (1072, 528),
    "5:3": (976, 592),
    "5:4": (848, 672),
    "9:6": (928, 624),
}


def _reference_size(w: int, h: int) -> tuple[int, int]:
    # the reference's formula: sides of a TARGET_PIXELS rectangle of shape w:h, floored to 16
    r = h / w
    return int((TARGET_PIXELS / r) ** 0.5 // 16 * 16), int((TARGET_PIXELS * r) ** 0.5 // 16 * 16)


def test_table_is_the_reference_table() -> None:
    assert RATIO_SIZES == EXPECTED
    for ratio, size in RATIO_SIZES.items():
        w, h = map(int, ratio.split(":"))
        assert size == _reference_size(w, h), ratio


def test_every_entry_is_a_multiple_of_16_near_768_squared_with_its_shape() -> None:
    for ratio, (width, height) in RATIO_SIZES.items():
        w, h = map(int, ratio.split(":"))
        assert width % 16 == 0 and height % 16 == 0, ratio
        # flooring both sides to 16 loses at most 2 * 16 / 768 ~ 4% (1:2 loses the most)
        assert 0.95 * TARGET_PIXELS <= width * height <= TARGET_PIXELS, ratio
        assert math.isclose(width / height, w / h, rel_tol=0.04), ratio


def test_every_ratio_has_its_inverse() -> None:
    for ratio, (width, height) in RATIO_SIZES.items():
        w, h = ratio.split(":")
        assert RATIO_SIZES[f"{h}:{w}"] == (height, width)


def test_ratio_tokens() -> None:
    assert size_for_ratio_token("<|vision_ratio_16:9|>") == (1024, 576)
    assert size_for_ratio_token("<|vision_ratio_9:16|>") == (576, 1024)
    assert size_for_ratio_token("<|vision_ratio_6:9|>") == (624, 928)
    assert size_for_ratio("1:1") == (768, 768)
    # every ratio token the embedded tokenizer has is drawable
    for token in SPECIAL_TOKENS:
        if token.startswith("<|vision_ratio_"):
            size_for_ratio_token(token)


@pytest.mark.parametrize("token", ["<|vision_ratio_2:3|>", "<|vision_ratio_7:1|>"])
def test_ratio_not_in_table(token: str) -> None:
    with pytest.raises(ValueError, match="not in the size table"):
        size_for_ratio_token(token)


@pytest.mark.parametrize("token", ["<|vision_ratio_16x9|>", "vision_ratio_16:9", "<|vision_token|>", ""])
def test_malformed_ratio_token(token: str) -> None:
    with pytest.raises(ValueError, match="not a ratio token"):
        size_for_ratio_token(token)


def test_parse_size() -> None:
    assert parse_size("auto") is None
    assert parse_size("1024x576") == (1024, 576)
    assert parse_size("768x768") == (768, 768)
    assert len(ALLOWED_SIZES) == 1 + len(RATIO_SIZES)
    for size in ALLOWED_SIZES[1:]:
        w, h = map(int, size.split("x"))
        assert parse_size(size) == (w, h)


@pytest.mark.parametrize("size", ["1024x1024", "576x1024x1", "768x769", "1536x1024", "0x0"])
def test_parse_size_rejects_sizes_outside_the_table(size: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_size(size)
    assert repr(size) in str(e.value) and "768x768" in str(e.value)


@pytest.mark.parametrize("size", ["", "AUTO", "1024 x 576", "1024X576", "-768x768", "768*768", "large"])
def test_parse_size_rejects_malformed(size: str) -> None:
    with pytest.raises(ValueError, match="not 'auto' or WIDTHxHEIGHT"):
        parse_size(size)


def test_latent_and_token_grids() -> None:
    assert latent_grid(768, 768) == (96, 96)
    assert latent_grid(1024, 576) == (72, 128)  # (rows, cols) = (height / 8, width / 8)
    assert token_grid(1024, 576) == (36, 64)
    for width, height in RATIO_SIZES.values():
        rows, cols = latent_grid(width, height)
        assert (rows * 8, cols * 8) == (height, width)
        assert token_grid(width, height) == (rows // 2, cols // 2)
    assert latent_grid(8, 16) == (2, 1)
    with pytest.raises(ValueError, match="multiples of 8"):
        latent_grid(770, 768)
    with pytest.raises(ValueError, match="multiples of 16"):
        token_grid(776, 768)  # a multiple of 8, not of 16
    with pytest.raises(ValueError, match="positive"):
        latent_grid(0, 768)


def test_nearest_size_takes_the_table_or_the_closest_aspect() -> None:
    from omni.shared.media.image_sizes import nearest_size

    assert nearest_size(16, 9) == (1024, 576)
    assert nearest_size(2, 3) == (624, 928)  # 6:9 written as 2:3: the same aspect
    assert nearest_size(21, 9) == (1072, 528)  # wider than any entry: the widest
    assert nearest_size(1, 1) == (768, 768)
