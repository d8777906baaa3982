"""POST /v1/images/generations without HTTP (the response: omni/http/handlers/images.py), and
the steps image edits (image_edits.py) share with it:

    the drawing model -> gates -> the prompt as a user turn -> the image span's opening token
    -> n choices held to the span grammar, each drawn with seed + i, previews on one queue
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

from omni.engines.generation import Generation, OutputOptions, new_request_id
from omni.errors import bad_request, service_unavailable
from omni.modalities.inputs.pipeline import PromptInputs
from omni.modalities.outputs.image import IMAGE, ImageSettings, queue_preview
from omni.modalities.outputs.kind import OutputSpans
from omni.modalities.outputs.router import OutputRouter
from omni.serving.choice_constraints import ChoiceConstraints
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.prepared import Prepared, check_serving
from omni.serving.prompt import chat_prompt
from omni.serving.requests import ChatCompletionRequest, parse_chat_completion_request
from omni.serving.requests.image_edits import ImageEditFields
from omni.serving.requests.images import ImageGenerationRequest
from omni.serving.sampling import request_priority
from omni.shared.media.compositing import EditCanvas
from scheduler.request import SamplingParams


async def image_generation(
    models: ModelRegistry, req: ImageGenerationRequest, *, timeout: float | None
) -> ImageGeneration:
    """POST /v1/images/generations: the prompt as a user turn, the reply forced to be one image
    span (the prompt ends with its opening token), n choices each drawn with seed + i."""
    model = image_model(models, req.model)
    turn = image_turn(model, req.prompt)
    settings = image_settings(model, req, req.size)
    check_drawing(model, settings.priority)
    prompt = await chat_prompt(model, turn, [])
    return image_choices(model, turn, prompt, settings, n=req.n, timeout=timeout)


def image_settings(
    model: ServedModel,
    req: ImageGenerationRequest | ImageEditFields,
    size: tuple[int, int] | None,
    canvas: EditCanvas | None = None,
) -> ImageSettings:
    """How the images API's request asks each image drawn (generations and edits share the fields)."""
    return ImageSettings(
        size=size,
        steps=req.num_inference_steps,
        guidance_scale=req.guidance_scale,
        step_cache=req.step_cache_threshold,
        seed=req.seed,
        output_format=req.output_format,
        quality=req.output_compression,
        as_url=req.response_format == "url" and not req.stream,
        partial_images=req.partial_images,
        canvas=canvas,
        priority=request_priority(model.pool.config.llm, req.priority),
    )


def image_turn(model: ServedModel, text: str) -> ChatCompletionRequest:
    """A drawing request's user turn, as the chat request its constraints are made for."""
    return parse_chat_completion_request(
        {
            "model": model.name,
            "messages": [{"role": "user", "content": text}],
            # the answer is the image: templates that reason first are told not to
            "chat_template_kwargs": {"enable_thinking": False, "skip_reasoning": True},
        }
    )


def check_drawing(model: ServedModel, priority: int) -> None:
    """The model's engines are up and its queue has room (503, 429), before any prompt work."""
    images = model.output(IMAGE)
    assert images is not None  # image_model
    check_serving(model)
    if not images.ready:
        raise service_unavailable("The image decoder is starting; retry shortly.", retry_after_s=5)
    model.pool.check_admission(priority)


def image_choices(
    model: ServedModel,
    turn: ChatCompletionRequest,
    prompt: PromptInputs,
    settings: ImageSettings,
    *,
    n: int,
    timeout: float | None,
) -> ImageGeneration:
    """n choices of the prompt followed by an image span's opening token, each held to the span
    grammar and drawn with settings.seed + i."""
    images = model.output(IMAGE)
    assert images is not None and images.grammar is not None  # compiled at start-up
    token_ids = [*prompt.token_ids, images.format.start_token_id]
    if len(token_ids) + images.format.span_tokens > model.pool.max_model_len:
        raise bad_request(
            f"The prompt is {len(token_ids)} tokens; with the {images.format.span_tokens} of an image it "
            f"exceeds the model's context of {model.pool.max_model_len}.",
            param="prompt",
            code="context_length_exceeded",
        )
    spans = OutputSpans(images.grammar, images.format.start_token_id, opened=True)
    constraints = ChoiceConstraints(model, turn, None, token_ids, images.format.span_tokens, [spans])
    previews: asyncio.Queue[Any] = asyncio.Queue()
    request_id = new_request_id("img")
    outputs = []
    for i in range(n):
        seed = None if settings.seed is None else settings.seed + i
        params = SamplingParams(max_tokens=images.format.span_tokens, seed=seed, priority=settings.priority)
        generation = Generation(
            model.pool, model.tokenizer, token_ids, params, f"{request_id}-{i}",
            output=OutputOptions(), media=prompt.media, constraint=constraints.new(),
        )  # fmt: skip
        on_preview = functools.partial(queue_preview, previews, i)
        outputs.append(OutputRouter(generation, images.route(settings, first_seed=seed, opened=True, on_preview=on_preview)))
    return ImageGeneration(model=model, outputs=outputs, timeout=timeout, previews=previews)


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageGeneration(Prepared):
    """Image generation, ready to run: one routed output per image (each draws exactly one),
    and the queue its previews arrive on, in the order they are made. The response may put its
    own events on the same queue (an image finished), so that one consumer sees both in the
    order they happened."""

    previews: asyncio.Queue[Any]  # ImagePreview, and what the response puts there itself
    # An edit's: previews are finished against it as its images are (ImageSettings.canvas)
    canvas: EditCanvas | None = None
    num_image_tokens: int = 0  # an edit's: the prompt tokens standing for its input images


def image_model(models: ModelRegistry, name: str | None) -> ServedModel:
    """The named model, which must draw images, or the only served model that does."""
    return models.capable(
        name, lambda m: m.output(IMAGE) is not None, lacks="has no image decoder: it cannot draw images",
        does=("draws images", "draw images"),
    )  # fmt: skip
