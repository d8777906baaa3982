"""POST /v1/images/generations bodies, and a chat request's `image` object and modalities: OpenAI's
fields and the diffusion extensions parse; what the decoder cannot honour, or a field of neither
API, is a 400 naming it."""

from __future__ import annotations

from typing import Any

import pytest

from omni.errors import APIError
from omni.serving.requests import parse_chat_completion_request
from omni.serving.requests.images import (
    ChatImageOptions,
    ImageGenerationRequest,
    parse_chat_image_options,
    parse_image_generation_request,
)
from omni.shared.media.image_sizes import ALLOWED_SIZES


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "omni-tiny", "prompt": "a red fox in snow", **fields}


def test_defaults() -> None:
    assert parse_image_generation_request(body()) == ImageGenerationRequest(model="omni-tiny", prompt="a red fox in snow")
    assert parse_image_generation_request({"prompt": "x"}).model is None  # the server picks


def test_every_field() -> None:
    r = parse_image_generation_request(
        body(
            n=2,
            size="1024x576",
            response_format="b64_json",
            output_format="webp",
            output_compression=80,
            stream=True,
            partial_images=2,
            quality="auto",
            background="auto",
            moderation="auto",
            user="u-1",
            seed=7,
            num_inference_steps=25,
            guidance_scale=0.75,
        )
    )
    assert (r.n, r.size, r.response_format, r.output_format, r.output_compression) == (2, (1024, 576), "b64_json", "webp", 80)
    assert (r.stream, r.partial_images, r.seed, r.num_inference_steps, r.guidance_scale) == (True, 2, 7, 25, 0.75)
    assert parse_image_generation_request(body(size="auto")).size is None


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"n": 0}, "n"),
        ({"n": 11}, "n"),
        ({"size": "1000x1000"}, "size"),
        ({"size": "big"}, "size"),
        ({"response_format": "file"}, "response_format"),
        ({"output_format": "gif"}, "output_format"),
        ({"output_format": "png", "output_compression": 50}, "output_compression"),
        ({"partial_images": 1}, "partial_images"),  # without stream
        ({"stream": True, "partial_images": 4}, "partial_images"),
        ({"quality": "hd"}, "quality"),
        ({"style": "vivid"}, "style"),
        ({"background": "transparent"}, "background"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"guidance_scale": -1}, "guidance_scale"),
        ({"step_cache_threshold": -0.1}, "step_cache_threshold"),
        ({"step_cache_threshold": "0.1"}, "step_cache_threshold"),
        ({"step_cache_threshold": 1001}, "step_cache_threshold"),
        ({"negative_prompt": "blur"}, "negative_prompt"),
        ({"seed": "7"}, "seed"),
    ],
)
def test_bad_fields_are_400s_naming_them(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as e:
        parse_image_generation_request(body(**fields))
    assert (e.value.status, e.value.param) == (400, param)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"num_inference_steps": 101}, "num_inference_steps"),
        ({"guidance_scale": 21}, "guidance_scale"),
        ({"stream": False, "partial_images": 2}, "partial_images"),
        ({"output_format": "jpeg", "output_compression": 101}, "output_compression"),
        ({"moderation": "low"}, "moderation"),
        ({"user": 5}, "user"),
        ({"n": True}, "n"),
        ({"prompt": "x" * 32_001}, "prompt"),
        pytest.param(
            {"output_compression": 50},  # png, the default, has no compression either
            "output_compression",
        ),
    ],
)
def test_more_bad_fields_are_400s_naming_them(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as e:
        parse_image_generation_request(body(**fields))
    assert (e.value.status, e.value.param) == (400, param)


def test_the_bounds_themselves_are_accepted() -> None:
    for fields in (
        {"n": 1, "num_inference_steps": 1, "guidance_scale": 0, "step_cache_threshold": 0},
        {"n": 10, "num_inference_steps": 100, "guidance_scale": 20, "stream": True, "partial_images": 3},
        {"step_cache_threshold": 1000},
        {"output_format": "jpeg", "output_compression": 0},
        {"quality": "standard", "background": "opaque", "style": None},
    ):
        parse_image_generation_request(body(**fields))


def test_a_size_outside_the_table_is_refused_with_the_table() -> None:
    with pytest.raises(APIError) as e:
        parse_image_generation_request(body(size="1024x1024"))  # OpenAI's default: not a trained shape
    assert (e.value.status, e.value.param) == (400, "size")
    assert all(size in e.value.message for size in ALLOWED_SIZES)
    for size in ALLOWED_SIZES[1:]:
        width, height = map(int, size.split("x"))
        assert parse_image_generation_request(body(size=size)).size == (width, height)


# ----------------------------------------------------------------------------- a chat request's `image`


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "omni-tiny", "messages": [{"role": "user", "content": "draw a fox"}], **fields}


def test_chat_image_options() -> None:
    assert parse_chat_image_options(chat()) is None
    assert parse_chat_image_options(chat(image=None)) is None
    assert parse_chat_image_options(chat(image={})) == ChatImageOptions()
    options = parse_chat_image_options(
        chat(
            image={
                "size": "576x1024",
                "response_format": "b64_json",
                "output_format": "webp",
                "output_compression": 70,
                "num_inference_steps": 12,
                "guidance_scale": 3.5,
            }
        )
    )
    assert options is not None and options.size == (576, 1024)
    assert options == ChatImageOptions(
        size_sent="576x1024",
        response_format="b64_json",
        output_format="webp",
        output_compression=70,
        num_inference_steps=12,
        guidance_scale=3.5,
    )
    auto = parse_chat_image_options(chat(image={"size": "auto"}))
    assert auto is not None and auto.size is None


@pytest.mark.parametrize(
    "image, param",
    [
        ("png", "image"),
        ({"size": "1024x1024"}, "image.size"),
        ({"size": 768}, "image.size"),
        ({"response_format": "file"}, "image.response_format"),
        ({"output_format": "gif"}, "image.output_format"),
        ({"output_compression": 80}, "image.output_compression"),  # png, the default
        ({"output_format": "png", "output_compression": 80}, "image.output_compression"),
        ({"output_format": "jpeg", "output_compression": -1}, "image.output_compression"),
        ({"num_inference_steps": 0}, "image.num_inference_steps"),
        ({"num_inference_steps": 101}, "image.num_inference_steps"),
        ({"guidance_scale": -1}, "image.guidance_scale"),
        ({"guidance_scale": 21}, "image.guidance_scale"),
        ({"guidance_scale": "high"}, "image.guidance_scale"),
        ({"step_cache_threshold": -1}, "image.step_cache_threshold"),
        ({"step_cache_threshold": "fast"}, "image.step_cache_threshold"),
        ({"xxx": 1}, "image.xxx"),
        ({"n": 2}, "image.n"),  # the images endpoint's field, not this object's
    ],
)
def test_bad_chat_image_options_are_400s_naming_them(image: Any, param: str) -> None:
    with pytest.raises(APIError) as e:
        parse_chat_image_options(chat(image=image))
    assert (e.value.status, e.value.param) == (400, param)
    with pytest.raises(APIError) as e:  # and the whole request, for the same field
        parse_chat_completion_request(chat(image=image))
    assert (e.value.status, e.value.param) == (400, param)


@pytest.mark.parametrize(
    "modalities, images_allowed",
    [(None, True), (["text", "image"], True), (["image"], True), (["text"], False)],
)
def test_modalities_say_whether_the_model_may_draw(modalities: list[str] | None, images_allowed: bool) -> None:
    req = parse_chat_completion_request(chat(modalities=modalities, image={"size": "768x768"}))
    assert req.images_allowed is images_allowed
    assert req.image == ChatImageOptions(size_sent="768x768") and req.image.size == (768, 768)


@pytest.mark.parametrize("modalities", [[], ["video"], "text"])
def test_modalities_the_server_cannot_produce_are_400s(modalities: Any) -> None:
    with pytest.raises(APIError) as e:
        parse_chat_completion_request(chat(modalities=modalities))
    assert (e.value.status, e.value.param) == (400, "modalities")


def test_priority_is_an_int_within_its_bounds() -> None:
    assert parse_image_generation_request({"prompt": "a cat"}).priority == 0
    assert parse_image_generation_request({"prompt": "a cat", "priority": 2**31 - 1}).priority == 2**31 - 1
    for bad in (-(2**31) - 1, True, "1"):
        with pytest.raises(APIError) as e:
            parse_image_generation_request({"prompt": "a cat", "priority": bad})
        assert (e.value.status, e.value.param) == (400, "priority")
