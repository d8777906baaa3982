"""POST /v1/images/generations bodies: OpenAI's fields and the diffusion extensions parse; what
the decoder cannot honour, or a field of neither API, is a 400 naming it."""

from __future__ import annotations

from typing import Any

import pytest

from omni.api.errors import APIError
from omni.api.schemas.images import ImageGenerationRequest, parse_image_generation_request


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
        ({"negative_prompt": "blur"}, "negative_prompt"),
        ({"seed": "7"}, "seed"),
    ],
)
def test_bad_fields_are_400s_naming_them(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as e:
        parse_image_generation_request(body(**fields))
    assert (e.value.status, e.value.param) == (400, param)
