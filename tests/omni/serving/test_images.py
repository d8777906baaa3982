"""The images lifecycle without workers: a drawing request needs a model that draws (a 400 naming
`model` otherwise, before any prompt work). Drawing itself runs on real workers in
tests/e2e/test_images.py and tests/e2e/test_image_edits.py."""

from __future__ import annotations

import pytest

from omni.errors import APIError
from omni.serving import images as lifecycle
from omni.serving.model import ModelRegistry
from omni.serving.requests.images import parse_image_generation_request


async def test_images_need_a_model_that_draws(models: ModelRegistry) -> None:
    with pytest.raises(APIError) as e:
        await lifecycle.image_generation(models, parse_image_generation_request({"prompt": "a cat"}), timeout=None)
    assert (e.value.status, e.value.param, e.value.message) == (400, "model", "No served model draws images.")
    with pytest.raises(APIError) as e:
        await lifecycle.image_generation(models, parse_image_generation_request({"model": "m", "prompt": "a cat"}), timeout=None)
    assert (e.value.status, e.value.param) == (400, "model")
