"""An edit's finishing step against numpy's own compositing: outside the mask (alpha > 0) every
pixel is the input's, exactly (worst difference 0); inside it the drawn image resized with
Pillow's Lanczos; at another size the input and mask are resized first; and a bad mask or
image is a MediaError naming its part."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from omni.shared.media.compositing import edit_canvas, encode
from omni.shared.media.errors import MediaError
from omni.shared.media.limits import MediaLimits

LIMITS = MediaLimits()
W, H = 40, 30


def _png(pixels: np.ndarray, mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, mode).save(buf, format="PNG")
    return buf.getvalue()


def _noise(seed: int, w: int, h: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _mask(w: int = W, h: int = H) -> tuple[bytes, np.ndarray]:
    alpha = np.random.default_rng(9).choice(np.array([0, 1, 128, 255], dtype=np.uint8), (h, w))
    rgba = np.zeros((h, w, 4), dtype=np.uint8)
    rgba[..., 3] = alpha
    return _png(rgba, "RGBA"), alpha > 0


def _read(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_outside_the_mask_every_pixel_is_the_inputs() -> None:
    source = _noise(1, W, H)
    drawn = _noise(2, 64, 48)  # the decoder's size for the shape
    mask, kept = _mask()
    canvas = edit_canvas(_png(source), mask, None, LIMITS)
    data, width, height = canvas.finish(_png(drawn), "png")
    out = _read(data)
    assert (width, height) == (W, H) == (out.shape[1], out.shape[0])
    expected_drawn = np.asarray(Image.fromarray(drawn).resize((W, H), Image.Resampling.LANCZOS))
    assert np.array_equal(out, np.where(kept[..., None], source, expected_drawn))  # worst difference 0


def test_at_another_size_the_input_and_mask_are_resized_first() -> None:
    source = _noise(3, W, H)
    mask, kept = _mask()
    canvas = edit_canvas(_png(source), mask, (64, 48), LIMITS)
    drawn = _noise(4, 64, 48)
    out = _read(canvas.finish(_png(drawn), "png")[0])
    base = np.asarray(Image.fromarray(source).resize((64, 48), Image.Resampling.LANCZOS))
    keep = np.asarray(Image.fromarray(kept.astype(np.uint8) * 255).resize((64, 48), Image.Resampling.NEAREST)) > 0
    assert np.array_equal(out, np.where(keep[..., None], base, drawn))


def test_without_a_mask_the_drawn_image_is_made_the_inputs_size() -> None:
    canvas = edit_canvas(_png(_noise(5, W, H)), None, None, LIMITS)
    drawn = _noise(6, 64, 48)
    data, width, height = canvas.finish(_png(drawn), "jpeg", 80)
    assert (width, height) == (W, H)
    assert Image.open(io.BytesIO(data)).format == "JPEG"
    assert data == encode(Image.fromarray(drawn).resize((W, H), Image.Resampling.LANCZOS), "jpeg", 80)


def test_a_fully_opaque_mask_keeps_the_whole_input() -> None:
    source = _noise(7, W, H)
    rgba = np.dstack([source, np.full((H, W), 255, dtype=np.uint8)])
    canvas = edit_canvas(_png(source), _png(rgba, "RGBA"), None, LIMITS)
    assert np.array_equal(_read(canvas.finish(_png(_noise(8, 64, 48)), "png")[0]), source)


def test_a_palette_mask_with_a_transparent_index_is_read() -> None:
    palette = Image.new("P", (W, H), 0)
    palette.putpalette([0, 0, 0, 255, 255, 255])
    palette.paste(1, (0, 0, W // 2, H))
    palette.info["transparency"] = 0  # index 0 (the right half) is fully transparent
    buf = io.BytesIO()
    palette.save(buf, format="PNG", transparency=0)
    source = _noise(10, W, H)
    out = _read(edit_canvas(_png(source), buf.getvalue(), None, LIMITS).finish(_png(_noise(11, W, H)), "png")[0])
    assert np.array_equal(out[:, : W // 2], source[:, : W // 2])
    assert not np.array_equal(out[:, W // 2 :], source[:, W // 2 :])


@pytest.mark.parametrize(
    "image, mask, param, words",
    [
        (b"\x89PNG\r\n\x1a\nbroken", None, "image", "could not decode"),
        (None, _mask(W + 1, H)[0], "mask", "the image's size"),
        (None, _png(_noise(12, W, H)), "mask", "no alpha channel"),
        (None, b"GIF89a....", "mask", "must be a PNG"),
        (None, b"\x89PNG\r\n\x1a\nbroken", "mask", "could not decode"),
    ],
)
def test_bad_parts_name_themselves(image: bytes | None, mask: bytes | None, param: str, words: str) -> None:
    with pytest.raises(MediaError) as e:
        edit_canvas(image or _png(_noise(13, W, H)), mask, None, LIMITS)
    assert e.value.param == param and words in e.value.message


def test_the_pixel_limit_holds_for_image_and_mask() -> None:
    small = MediaLimits(max_image_pixels=W * H - 1)
    for image, mask, param in ((_png(_noise(14, W, H)), None, "image"),):
        with pytest.raises(MediaError) as e:
            edit_canvas(image, mask, None, small)
        assert e.value.param == param
    with pytest.raises(MediaError) as e:
        edit_canvas(_png(_noise(15, 10, 10)), _mask()[0], None, small)
    assert e.value.param == "mask"
