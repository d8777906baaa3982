"""A user item's input_image part, checked when conversation.item.create brings it: its bytes
loaded under chat's rules (a data: URL, or an http(s) URL only with --allow-remote-media and
only to public addresses: omni/modalities/inputs/source.py), a data URL's mime type an image's,
the bytes an image (not a video) that decodes within the pixel limit. A bad one is refused
there, naming the part (item.content[i].image_url), and the item is not added.

What the conversation keeps is the image as a data URL of the loaded bytes: every turn renders
the same bytes (a remote URL is fetched once), so chat's MediaPipeline finds them in its
encoder cache and the prefix cache holds the turns before. The encoder starts on them at once
(encode_ahead): a user shows an image and then speaks, and the turn's prefill does not wait
for the encoder.
"""

from __future__ import annotations

import asyncio
import base64
import io
from dataclasses import dataclass

from PIL import Image

from omni.errors import APIError, bad_request, internal_error
from omni.modalities.inputs.items import MediaItem, MediaRef, load_items
from omni.modalities.inputs.placeholders import PLACEHOLDERS
from omni.serving.errors import api_error
from omni.serving.model import ServedModel
from omni.serving.realtime import client_events as ev
from omni.serving.sampling import voice_priority
from omni.shared.media import MediaLimits
from omni.shared.media.errors import MediaError
from omni.shared.media.image import decode_image

IMAGE_COMPONENTS = frozenset(p.component for p in PLACEHOLDERS.values() if p.kind == "image")


@dataclass(frozen=True, slots=True)
class LoadedImage:
    url: str  # what the conversation renders: a data URL of the bytes
    item: MediaItem  # the bytes as chat's turn will load them (its content hash, its param)


async def item_images(model: ServedModel, item_id: str, item: ev.Item) -> dict[int, LoadedImage]:
    """A user message's input_image parts loaded and checked, by content index; a bad one is an
    error naming the item and the part."""
    if not isinstance(item, ev.MessageItem):
        return {}
    images: dict[int, LoadedImage] = {}
    for i, part in enumerate(item.content):
        if not isinstance(part, ev.InputImage):
            continue
        param = f"item.content[{i}].image_url"
        try:
            images[i] = await load_input_image(model, part.image_url, param)
        except (APIError, MediaError) as exc:
            error = api_error(exc) or internal_error()
            raise APIError(error.status, f"Item '{item_id}', content[{i}]: {error.message}", type=error.type,
                           param=error.param or param, code=error.code, headers=error.headers) from None  # fmt: skip
    return images


def data_url_mime(url: str) -> str | None:
    """A data: URL's mime type (lower case), None for another URL."""
    if url[:5].lower() != "data:":
        return None
    return url[5:].partition(",")[0].split(";")[0].strip().lower()


async def load_input_image(model: ServedModel, url: str, param: str) -> LoadedImage:
    """The image at url, checked."""
    media = model.media
    if media is None or not IMAGE_COMPONENTS & media.encoder.components:
        raise bad_request(f"The model '{model.name}' does not accept image input.", param=param,
                          code="unsupported_content_type")  # fmt: skip
    mime = data_url_mime(url)
    if mime is not None and not mime.startswith("image/"):
        raise MediaError(f"The data URL in {param} is {mime or 'untyped'}, not an image.", param=param)
    (item,) = await load_items([MediaRef(param, "image", url=url)], media.limits)
    if item.kind != "image":  # chat reads a video sent as image_url; an input_image is an image
        raise MediaError(f"The data in {param} is a {item.kind}, not an image.", param=param)
    fmt = await asyncio.to_thread(_image_format, item.data, media.limits, param)
    if mime is None:  # fetched: the bytes from now on (a data URL is kept as it came)
        url = f"data:image/{fmt};base64,{base64.b64encode(item.data).decode()}"
    return LoadedImage(url, item)


async def encode_ahead(model: ServedModel, images: list[LoadedImage]) -> None:
    """The images through the encoder now, while the user is still to speak: the turn that asks
    about them finds them in the encoder cache (or joins the encode under way)."""
    if model.media is not None:
        priority = voice_priority(model.pool.config.llm)  # as the turn's own
        await asyncio.gather(*(model.media.encode_ahead(image.item, priority=priority) for image in images))


def _image_format(data: bytes, limits: MediaLimits, param: str) -> str:
    """The image's format (png, jpeg, ...) once it decodes whole within the limits."""
    decode_image(data, limits, param)  # a MediaError naming param if not
    with Image.open(io.BytesIO(data)) as image:  # the header again: decode_image's copy is RGB, formatless
        return (image.format or "png").lower()
