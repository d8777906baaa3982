"""An input_image part checked at conversation.item.create: loaded under chat's media rules,
kept as a data URL of its bytes; a bad one (not an image's mime type, a video, undecodable, over
the pixel limit, a refused URL, a model that reads no images) is an error naming the item and
the part. The whole path runs in tests/e2e/test_realtime.py."""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from PIL import Image

from omni.config import LLMConfig
from omni.errors import APIError
from omni.modalities.inputs import items as items_module
from omni.serving.realtime import client_events as ev
from omni.serving.realtime.input_image import data_url_mime, encode_ahead, item_images, load_input_image
from omni.shared.media import MediaLimits
from omni.shared.media.errors import MediaError

PARAM = "item.content[1].image_url"


def _png(width: int = 16, height: int = 12) -> bytes:
    buf = io.BytesIO()
    Image.fromarray((np.random.default_rng(0).random((height, width, 3)) * 255).astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _model(components: frozenset[str] = frozenset({"vision_encoder", "image_tokenizer"}), **limits: Any) -> Any:
    media = SimpleNamespace(limits=MediaLimits(**limits), encoder=SimpleNamespace(components=components))
    return SimpleNamespace(name="m", media=media)


def _url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


async def test_a_data_url_image_is_kept_as_it_came() -> None:
    url = _url(_png())
    image = await load_input_image(_model(), url, PARAM)
    assert image.url == url and (image.item.kind, image.item.param) == ("image", PARAM)
    assert image.item.data == base64.b64decode(url.partition(",")[2])


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (_url(_png(), "text/plain"), "text/plain, not an image"),
        (_url(b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00"), "a video, not an image"),
        (_url(b"not a picture at all"), "could not decode image"),
        ("data:image/png;base64,@@@", "Invalid base64"),
        (_url(_png(40, 40)), "over the limit of 1000"),
        ("http://127.0.0.1/cat.png", "Remote media URLs are disabled"),
        ("ftp://example.com/cat.png", "Unsupported media URL"),
    ],
    ids=["mime", "video", "undecodable", "base64", "pixels", "remote", "scheme"],
)
async def test_a_bad_image_is_a_media_error_naming_the_part(url: str, says: str) -> None:
    with pytest.raises(MediaError) as e:
        await load_input_image(_model(max_image_pixels=1000), url, PARAM)
    assert e.value.param == PARAM and says in e.value.message, e.value.message


async def test_a_remote_url_follows_chats_rules_when_allowed() -> None:
    with pytest.raises(MediaError) as e:  # allowed, but never to a private address
        await load_input_image(_model(allow_remote=True), "http://127.0.0.1/cat.png", PARAM)
    assert e.value.param == PARAM and "non-public address" in e.value.message


@pytest.mark.parametrize("model", [SimpleNamespace(name="m", media=None), _model(frozenset({"audio_encoder"}))])
async def test_a_model_that_reads_no_images_refuses_them(model: Any) -> None:
    with pytest.raises(APIError) as e:
        await load_input_image(model, _url(_png()), PARAM)
    assert (e.value.param, e.value.code) == (PARAM, "unsupported_content_type")


async def test_an_items_images_come_by_content_index_and_a_bad_one_names_the_item() -> None:
    good = _url(_png())
    item = ev.MessageItem(role="user", content=[ev.InputText(text="Look:"), ev.InputImage(image_url=good)])
    assert {i: image.url for i, image in (await item_images(_model(), "item_1", item)).items()} == {1: good}
    item = ev.MessageItem(role="user", content=[ev.InputImage(image_url=good), ev.InputImage(image_url=_url(b"junk"))])
    with pytest.raises(APIError) as e:
        await item_images(_model(), "item_2", item)
    assert (e.value.status, e.value.param) == (400, PARAM)
    assert e.value.message.startswith("Item 'item_2', content[1]: could not decode image")
    call = ev.FunctionCallItem(name="f", arguments="{}")
    assert await item_images(cast(Any, None), "item_3", call) == {}


def test_a_data_urls_mime_type() -> None:
    assert data_url_mime("DATA:Image/PNG;base64,xx") == "image/png"
    assert data_url_mime("data:;base64,xx") == ""
    assert data_url_mime("https://example.com/a.png") is None


async def test_a_fetched_image_is_kept_as_a_data_url_of_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    png = _png()

    async def fetched(url: str, limits: MediaLimits, param: str) -> bytes:
        return png

    monkeypatch.setattr(items_module, "load_media_bytes", fetched)
    image = await load_input_image(_model(allow_remote=True), "https://example.com/boat.png", PARAM)
    assert image.url == _url(png, "image/png") and image.item.data == png


async def test_images_are_encoded_ahead_through_the_models_pipeline() -> None:
    asked: list[Any] = []

    async def ahead(item: Any, *, priority: int) -> None:
        asked.append((item, priority))

    model = _model()
    model.media.encode_ahead = ahead
    model.pool = SimpleNamespace(config=SimpleNamespace(llm=LLMConfig(scheduling_policy="priority", voice_priority=-3)))
    image = await load_input_image(model, _url(_png()), PARAM)
    await encode_ahead(model, [image, image])
    assert asked == [(image.item, -3), (image.item, -3)]  # a live session's, as its turn's
    await encode_ahead(SimpleNamespace(media=None), [image])  # a model without media: nothing to do
