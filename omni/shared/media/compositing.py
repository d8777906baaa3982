"""An image edit's last step: the drawn image made the edit's size, and, with a mask, put back
into the input image outside the mask.

OpenAI's mask convention: a PNG of the input's size whose fully transparent pixels (alpha 0)
mark the region to change. Every other pixel, partly transparent ones too, is kept from the
input exactly. The output's size is the request's `size`, or the input's (size auto):

    size == the input's   the drawn image is resized to it; outside the mask each pixel is the
                          input's own
    size != the input's   the input (Lanczos) and the mask (nearest: it stays 0 or 255) are
                          resized to `size` first; outside the mask each pixel is the resized
                          input's

The drawn image comes at the decoder's size for the aspect (omni/shared/media/image_sizes.py)
and is resized (Lanczos) to the output's. Kept pixels are exact in a PNG; jpeg and webp output
is lossy, so there they are only close.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image

from omni.shared.media.errors import MediaError
from omni.shared.media.image import decode_image
from omni.shared.media.limits import MediaLimits

# OpenAI's default output_compression is 100; the decoder's own default is 95
DEFAULT_QUALITY = 95


@dataclass(frozen=True, slots=True)
class EditCanvas:
    """What every image of one edit request is finished against."""

    size: tuple[int, int]  # (width, height) of the output
    base: Image.Image | None  # the first input image at `size`, RGB; None without a mask
    keep: Image.Image | None  # mode L, 255 where the input is kept and 0 elsewhere, at `size`

    def finish(self, drawn: bytes, output_format: str, quality: int | None = None) -> tuple[bytes, int, int]:
        """The drawn image (any format PIL reads) at the output's size, composited, encoded:
        (bytes, width, height)."""
        with Image.open(io.BytesIO(drawn)) as opened:
            image = opened.convert("RGB")
        if image.size != self.size:
            image = image.resize(self.size, Image.Resampling.LANCZOS)
        if self.base is not None and self.keep is not None:
            image = Image.composite(self.base, image, self.keep)  # base where keep is 255
        return encode(image, output_format, quality), image.width, image.height


def edit_canvas(
    image: bytes, mask: bytes | None, size: tuple[int, int] | None, limits: MediaLimits, *, param: str = "image"
) -> EditCanvas:
    """The canvas for an edit of `image` (the first input) with `mask`, at `size` (None: the
    image's). A bad image is a MediaError naming param; a mask that is not a PNG with an
    alpha channel, or not of the image's size, one naming `mask`."""
    base = decode_image(image, limits, param)
    out = size or base.size
    if mask is None:
        return EditCanvas(out, None, None)
    alpha = mask_alpha(mask, limits)
    if alpha.size != base.size:
        raise MediaError(
            f"The mask is {alpha.width}x{alpha.height}; it must be the image's size, "
            f"{base.width}x{base.height}.",
            param="mask",
        )
    keep = alpha.point(lambda a: 255 if a > 0 else 0)  # only fully transparent pixels change
    if out != base.size:
        base = base.resize(out, Image.Resampling.LANCZOS)
        keep = keep.resize(out, Image.Resampling.NEAREST)
    return EditCanvas(out, base, keep)


def mask_alpha(data: bytes, limits: MediaLimits) -> Image.Image:
    """The mask's alpha channel (mode L). It must be a PNG with transparency."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise MediaError("The mask must be a PNG (its transparent pixels mark the region to change).", param="mask")
    decode_image(data, limits, "mask")  # the bytes and pixels checked; it keeps only RGB
    with Image.open(io.BytesIO(data)) as opened:
        if "A" not in opened.getbands() and "transparency" not in opened.info:
            raise MediaError(
                "The mask has no alpha channel: its fully transparent pixels mark the region to change.",
                param="mask",
            )
        return opened.convert("RGBA").getchannel("A")


def encode(image: Image.Image, output_format: str, quality: int | None = None) -> bytes:
    """png (lossless), jpeg or webp at quality (default DEFAULT_QUALITY), as the decoder
    encodes its own images."""
    out = io.BytesIO()
    if output_format == "png":
        image.save(out, format="PNG")
    elif output_format == "jpeg":
        image.save(out, format="JPEG", quality=DEFAULT_QUALITY if quality is None else quality)
    elif output_format == "webp":
        image.save(out, format="WEBP", quality=DEFAULT_QUALITY if quality is None else quality)
    else:
        raise ValueError(f"image format {output_format!r} is not png, jpeg or webp")
    return out.getvalue()
