"""The image's chat side: whether a chat request's choices draw, with which settings and seeds,
and where the drawn images go in the body (content parts, none when inline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from omni.engines.generation import Delta
from omni.engines.pool import ModelPool
from omni.engines.vision_replicas import VisionDecoderReplicas
from omni.errors import APIError
from omni.metrics import Metrics
from omni.modalities.outputs.image import IMAGE, GeneratedImage, ImageSettings, ModelImages
from omni.modalities.outputs.image_chat import (
    SEEDS_PER_CHOICE,
    ImageDecoderDetails,
    OutputImagePart,
    OutputImageURL,
    chat_images,
)
from omni.serving.model import ServedModel
from omni.serving.requests import parse_chat_completion_request
from omni.shared.store.base import ArtifactStore
from omni.text.chat_format import ChatFormat
from omni.text.constrained.image_span import ImageSpanFormat
from omni.text.tokenizer import TextTokenizer
from tests.omni.fake_pool import FakePool

T2I = {"type": "function", "function": {"name": "t2i_model_generation", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def served(tokenizer: TextTokenizer, *, draws: bool = True, **fmt: Any) -> ServedModel:
    image_fmt = ImageSpanFormat.from_tokenizer(tokenizer, 2, 3)
    assert image_fmt is not None
    images = ModelImages(cast(VisionDecoderReplicas, None), image_fmt, cast(ArtifactStore, None), Metrics())
    return ServedModel(
        "m", tokenizer, cast(ModelPool, FakePool([1])), created=0, outputs=(images,) if draws else (),
        chat_format=ChatFormat(**fmt),
    )  # fmt: skip


def chat(**fields: Any) -> Any:
    return parse_chat_completion_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_images_come_unasked_and_modalities_can_leave_them_out(tokenizer: TextTokenizer) -> None:
    model = served(tokenizer)
    drawn = chat_images(model, chat())
    assert drawn is not None and drawn.images is model.output(IMAGE)
    assert drawn.settings == ImageSettings() and not drawn.inline  # no `image` object: every default
    assert chat_images(model, chat(modalities=["text", "image"])) is not None
    assert chat_images(model, chat(modalities=["text"])) is None


def test_asking_a_model_without_a_decoder_for_images_is_a_400(tokenizer: TextTokenizer) -> None:
    model = served(tokenizer, draws=False)
    assert chat_images(model, chat()) is None  # none asked for: none made
    with pytest.raises(APIError) as refused:
        chat_images(model, chat(modalities=["text", "image"]))
    assert (refused.value.status, refused.value.param) == (400, "modalities")


def test_the_image_object_and_the_seed_make_the_settings_and_each_choice_counts_its_seeds_on(tokenizer: TextTokenizer) -> None:
    options = {"size": "528x1072", "num_inference_steps": 4, "guidance_scale": 2.5, "response_format": "b64_json",
               "output_format": "webp", "output_compression": 80}  # fmt: skip
    drawn = chat_images(served(tokenizer), chat(image=options, seed=7))
    assert drawn is not None
    assert drawn.settings == ImageSettings(
        size=(528, 1072), steps=4, guidance_scale=2.5, seed=7, output_format="webp", quality=80, as_url=False
    )
    routes = [drawn.route(served(tokenizer), i) for i in range(3)]
    assert [cast(Any, r.decoder).first_seed for r in routes] == [7, 7 + SEEDS_PER_CHOICE, 7 + 2 * SEEDS_PER_CHOICE]
    unseeded = chat_images(served(tokenizer), chat())
    assert unseeded is not None and cast(Any, unseeded.route(served(tokenizer), 1).decoder).first_seed is None


def test_the_reference_dialect_writes_the_image_into_its_tool_call(tokenizer: TextTokenizer) -> None:
    dialect = served(tokenizer, tool_parser="hyperclovax")
    inline = chat_images(dialect, chat(tools=[T2I]))
    assert inline is not None and inline.inline and inline.route(dialect, 0).inline
    assert inline.call_rules() == inline.images.format.rules("image")  # its argument is a whole span
    off = chat_images(dialect, chat(tools=[T2I], tool_choice="none"))
    assert off is not None and not off.inline
    assert not cast(Any, chat_images(served(tokenizer, tool_parser="hermes"), chat(tools=[T2I]))).inline


def test_nothing_is_drawn_under_an_answer_format(tokenizer: TextTokenizer) -> None:
    drawn = chat_images(served(tokenizer), chat())
    assert drawn is not None and drawn.answer_format() is None


async def test_drawn_images_follow_the_text_as_parts_unless_inline(tokenizer: TextTokenizer) -> None:
    delta = Delta("", [])
    for url in ("http://x/a.png", "http://x/b.png"):
        IMAGE.add(delta, GeneratedImage(url, 64, 64))
    drawn = chat_images(served(tokenizer), chat())
    assert drawn is not None
    body = drawn.body(1)
    assert body.parts(delta) == [OutputImagePart(OutputImageURL("http://x/a.png")), OutputImagePart(OutputImageURL("http://x/b.png"))]
    assert body.parts(Delta("no image", [])) == []
    assert (await body.message(delta, "text"), body.delta(0, delta, "text"), body.spoke(0, delta)) == ({}, {}, False)
    dialect = served(tokenizer, tool_parser="hyperclovax")
    inline = chat_images(dialect, chat(tools=[T2I]))
    assert inline is not None and inline.body(1).parts(delta) == []  # the URL is in the text


def test_the_usage_sums_the_decoder_work_of_every_image_drawn_inline_or_not(tokenizer: TextTokenizer) -> None:
    """usage.decoder_details counts each image that count() saw, of every choice; a turn that
    drew none fills no usage field, so its usage is as a text turn's."""
    first, second = Delta("", []), Delta("", [])
    IMAGE.add(first, GeneratedImage("http://x/a.png", 64, 64, blocks_computed=40, blocks_skipped=8))
    IMAGE.add(second, GeneratedImage("http://x/b.png", 64, 64, blocks_computed=30, blocks_skipped=18))
    for dialect, req in ((served(tokenizer), chat()), (served(tokenizer, tool_parser="hyperclovax"), chat(tools=[T2I]))):
        drawn = chat_images(dialect, req)
        assert drawn is not None
        body = drawn.body(2)
        body.count(Delta("no image", []))
        assert body.usage() == {}
        body.count(first)
        body.count(second)
        assert body.usage() == {"decoder_details": ImageDecoderDetails(blocks_computed=70, blocks_skipped=26)}
