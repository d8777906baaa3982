"""POST /v1/images/edits, the lifecycle (the form: omni/serving/requests/image_edits.py; the
response: omni/http/handlers/images.py). It reads as the other endpoints' do, and shares
the images API's steps (omni/serving/images.py):

    model -> input images checked (and the edit's canvas) -> prompt: the images, then the
    edit, as a user turn -> the image span's opening token -> n choices held to the span grammar

The input images go into the prompt as a chat's image parts do (the encoders' features and
discrete codes), so the model draws with them in view, as the reference edits. Each drawn
image is then finished against the canvas (omni/shared/media/compositing.py): made the output's
size (the request's, or the first image's) and, with a mask, put back into the first image
outside the mask, so those pixels are the input's exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses

from omni.errors import bad_request
from omni.modalities.inputs.items import MediaItem, decode_params
from omni.modalities.inputs.placeholders import placeholder_ids
from omni.serving.images import ImageGeneration, check_drawing, image_choices, image_model, image_settings, image_turn
from omni.serving.model import ModelRegistry
from omni.serving.prepared import answer_template
from omni.serving.requests.image_edits import ImageEditFields
from omni.serving.sampling import request_priority
from omni.shared.media import MediaLimits
from omni.shared.media.compositing import EditCanvas, edit_canvas
from omni.shared.media.image import decode_image
from omni.shared.media.image_sizes import nearest_size
from omni.shared.store.keys import content_hash


async def image_edit(models: ModelRegistry, req: ImageEditFields, *, timeout: float | None) -> ImageGeneration:
    model = image_model(models, req.model_name)
    media = model.media
    if media is None:
        raise bad_request(f"The model '{model.name}' has no image encoder: it cannot read the image.", param="image")
    media.limits.check_num_items(len(req.image), "image")
    priority = request_priority(model.pool.config.llm, req.priority)
    check_drawing(model, priority)
    # Decoding checks every image (and the mask) here, off the loop: a bad one is a 400 naming it.
    canvas, items = await asyncio.to_thread(_read_inputs, req, media.limits)
    turn = [*({"type": "image", "id": f"image_{i}"} for i in range(len(items))), {"type": "text", "text": req.prompt}]
    template_ids = await asyncio.to_thread(answer_template, model, [{"role": "user", "content": turn}])
    prompt = await media.expand(template_ids, items, priority=priority)
    # Drawn at the table's size nearest the canvas's shape, then made the canvas's size; without a
    # mask, an image drawn at the asked size is finished as it is.
    size = req.size or nearest_size(*canvas.size)
    settings = image_settings(model, req, size, None if req.size is not None and req.mask is None else canvas)
    generation = image_choices(model, image_turn(model, req.prompt), prompt, settings, n=req.n, timeout=timeout)
    placeholders = placeholder_ids(model.tokenizer)
    num_images = len(prompt.token_ids) - sum(t not in placeholders for t in template_ids)
    return dataclasses.replace(generation, canvas=settings.canvas, num_image_tokens=num_images)


def _read_inputs(req: ImageEditFields, limits: MediaLimits) -> tuple[EditCanvas, list[MediaItem]]:
    """The first image's canvas (with the mask), the other images decoded to be sure of them,
    and every image as a media item."""
    params = ["image"] if len(req.image) == 1 else [f"image[{i}]" for i in range(len(req.image))]
    canvas = edit_canvas(req.image[0], req.mask, req.size, limits, param=params[0])
    for param, data in zip(params[1:], req.image[1:]):
        decode_image(data, limits, param)
    hashed = decode_params("image", limits)
    return canvas, [MediaItem("image", p, d, None, content_hash(d, hashed)) for p, d in zip(params, req.image)]
