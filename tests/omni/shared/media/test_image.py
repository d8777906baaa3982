import io
import struct
import zlib

import pytest
from PIL import Image

from omni.shared.media.errors import MediaError
from omni.shared.media.image import decode_image
from omni.shared.media.limits import MediaLimits
from tests.omni.shared.media.conftest import png_bytes

PARAM = "messages[0].content[1].image_url"


def _error(data: bytes, limits: MediaLimits = MediaLimits()) -> MediaError:
    with pytest.raises(MediaError) as e:
        decode_image(data, limits, PARAM)
    assert e.value.param == PARAM
    return e.value


def _png_header_only(width: int, height: int) -> bytes:
    # A valid signature and IHDR claiming a huge size, then an empty IDAT: no pixel data.
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"")


def test_png_and_jpeg_decode_to_rgb() -> None:
    image = decode_image(png_bytes(32, 24), MediaLimits(), PARAM)
    assert (image.mode, image.size) == ("RGB", (32, 24))
    buf = io.BytesIO()
    Image.new("L", (7, 5), 99).save(buf, format="JPEG")
    image = decode_image(buf.getvalue(), MediaLimits(), PARAM)
    assert (image.mode, image.size) == ("RGB", (7, 5))


def test_rgba_converts_to_rgb() -> None:
    buf = io.BytesIO()
    Image.new("RGBA", (4, 4), (1, 2, 3, 0)).save(buf, format="PNG")
    assert decode_image(buf.getvalue(), MediaLimits(), PARAM).mode == "RGB"


def test_animated_gif_gives_first_frame() -> None:
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    image = decode_image(buf.getvalue(), MediaLimits(), PARAM)
    assert image.size == (8, 8)
    r, g, b = image.getpixel((0, 0))
    assert r > 200 and b < 50


@pytest.mark.parametrize("side", [6_000, 100_000])  # under, then over, Pillow's own bomb limit
def test_pixel_limit_from_header_before_decoding(side: int) -> None:
    error = _error(_png_header_only(side, side))
    assert "max_image_pixels" in error.message


def test_small_pixel_limit() -> None:
    error = _error(png_bytes(32, 24), MediaLimits(max_image_pixels=32 * 24 - 1))
    assert "max_image_pixels" in error.message
    decode_image(png_bytes(32, 24), MediaLimits(max_image_pixels=32 * 24), PARAM)


def test_byte_limit() -> None:
    data = png_bytes()
    assert "max_bytes" in _error(data, MediaLimits(max_bytes=len(data) - 1)).message


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image", png_bytes()[:40], b"\x89PNG\r\n\x1a\n" + b"\x00" * 64,
     b"\xff\xd8\xff\xe0" + b"\x00" * 32, b"GIF89a" + b"\xff" * 20],
)
def test_corrupt_image(data: bytes) -> None:
    assert _error(data).message == f"could not decode image in {PARAM}"
