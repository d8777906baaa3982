from __future__ import annotations

import io
import warnings

from PIL import Image

from omni.shared.media.errors import MediaError
from omni.shared.media.limits import MediaLimits


def decode_image(data: bytes, limits: MediaLimits, param: str) -> Image.Image:
    if len(data) > limits.max_bytes:
        raise MediaError(
            f"Image in {param} is larger than {limits.max_bytes} bytes (max_bytes).", param=param
        )
    try:
        with warnings.catch_warnings():
            # Our own pixel limit below is the one that counts; Pillow's process-wide
            # MAX_IMAGE_PIXELS stays as it is (no global state to mutate).
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size  # from the header: nothing decoded yet
            if width * height > limits.max_image_pixels:
                raise MediaError(_too_many_pixels(width, height, limits, param), param=param)
            image.seek(0)  # animated images (GIF, APNG, WebP): the first frame
            image.load()
            return image.convert("RGB")
    except MediaError:
        raise
    except Image.DecompressionBombError:
        raise MediaError(
            f"Image in {param} has too many pixels (max_image_pixels is "
            f"{limits.max_image_pixels}).",
            param=param,
        ) from None
    except Exception:
        # Pillow's plugins raise many types on bad input (OSError, SyntaxError, struct.error,
        # IndexError, ...): all of them mean the client sent something that is not an image.
        raise MediaError(f"could not decode image in {param}", param=param) from None


def _too_many_pixels(width: int, height: int, limits: MediaLimits, param: str) -> str:
    return (
        f"Image in {param} is {width}x{height} = {width * height} pixels, over the limit of "
        f"{limits.max_image_pixels} (max_image_pixels)."
    )
