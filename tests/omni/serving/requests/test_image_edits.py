"""POST /v1/images/edits: the multipart form's fields parse as OpenAI's (the official client's
`image[]` parts for several images, `svg[model]` for its nested object), what this decoder
cannot make or a field of neither API is a 400 naming it; and the form is read off HTTP with
its files bounded by --max-media-bytes (omni/http/body.py read_image_edit_form)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni.errors import APIError
from omni.http.body import read_image_edit_form
from omni.http.errors import error_middleware
from omni.serving.requests.image_edits import ImageEditFields, ImageEditForm, parse_image_edit_request
from omni.serving.requests.images import MAX_PROMPT_CHARS

PNG = b"\x89PNG\r\n\x1a\n...."  # never decoded here: the lifecycle decodes
MASK = b"\x89PNG\r\n\x1a\nmask"


def form(images: list[bytes] | None = None, mask_file: bytes | None = None, **fields: str | list[str]) -> ImageEditForm:
    files: dict[str, list[bytes]] = {"image": [PNG] if images is None else images}
    if mask_file is not None:
        files["mask"] = [mask_file]
    if not files["image"]:
        del files["image"]
    text = {"prompt": "make it blue", **fields}
    return ImageEditForm({k: v if isinstance(v, list) else [v] for k, v in text.items()}, files)


def test_defaults() -> None:
    r = parse_image_edit_request(form())
    assert r == ImageEditFields(image=[PNG], prompt="make it blue")
    assert (r.model_name, r.size, r.n, r.response_format, r.output_format, r.stream) == (None, None, 1, "url", "png", False)


def test_every_field() -> None:
    r = parse_image_edit_request(
        form(
            [PNG, b"second"],
            MASK,
            model="omni",
            n="3",
            size="1024x576",
            response_format="b64_json",
            output_format="webp",
            output_compression="70",
            stream="True",  # what Python's str() makes of a bool
            partial_images="2",
            quality="auto",
            background="opaque",
            input_fidelity="low",
            user="u",
            safety_identifier="s",
            seed="7",
            num_inference_steps="4",
            guidance_scale="2.5",
            step_cache_threshold="0.25",
        )
    )
    assert r.image == [PNG, b"second"] and r.mask == MASK
    assert (r.model_name, r.n, r.size, r.response_format, r.output_format, r.output_compression) == (
        "omni", 3, (1024, 576), "b64_json", "webp", 70
    )
    assert (r.stream, r.partial_images, r.seed, r.num_inference_steps, r.guidance_scale) == (True, 2, 7, 4, 2.5)
    assert r.step_cache_threshold == 0.25


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"size": "1000x1000"}, "size", "auto"),
        ({"n": "0"}, "n", "between 1 and 10"),
        ({"n": "11"}, "n", "between 1 and 10"),
        ({"n": "two"}, "n", "an integer"),
        ({"output_format": "gif"}, "output_format", "expected one of"),
        ({"output_format": "svg"}, "output_format", "expected one of"),
        ({"output_compression": "50"}, "output_compression", "jpeg and webp"),
        ({"response_format": "file"}, "response_format", "expected one of"),
        ({"partial_images": "2"}, "partial_images", "stream"),
        ({"partial_images": "4", "stream": "true"}, "partial_images", "between 0 and 3"),
        ({"stream": "yes"}, "stream", "true or false"),
        ({"quality": "high"}, "quality", "auto"),
        ({"background": "transparent"}, "background", "opaque"),
        ({"input_fidelity": "high"}, "input_fidelity", "low"),
        ({"complexity": "low"}, "complexity", "plans"),
        ({"frame_count": "4"}, "frame_count", "GIF"),
        ({"svg[model]": "x"}, "svg", "SVG"),
        ({"markup": "x"}, "markup", "mask"),
        ({"prompt": " "}, "prompt", "empty"),
        ({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}, "prompt", "at most"),
        ({"prompt": ["a", "b"]}, "prompt", "once"),
        ({"seed": str(2**64)}, "seed", "between"),
        ({"num_inference_steps": "0"}, "num_inference_steps", "between 1 and 100"),
        ({"step_cache_threshold": "-0.5"}, "step_cache_threshold", "between 0 and 1000"),
        ({"step_cache_threshold": "fast"}, "step_cache_threshold", "a number"),
        ({"style": "vivid"}, "style", "not a field"),
        ({"image": "https://example.com/a.png"}, "image", "file part"),
        ({"mask": "data:image/png;base64,AAAA"}, "mask", "file part"),
    ],
)
def test_bad_fields_are_400s_naming_them(fields: dict[str, Any], param: str, words: str) -> None:
    images = [] if "image" in fields else None  # a text image alone
    with pytest.raises(APIError) as e:
        parse_image_edit_request(form(images, **fields))
    assert (e.value.status, e.value.param) == (400, param)
    assert words in e.value.message, e.value.message


@pytest.mark.parametrize(
    "the_form, param",
    [
        (form([]), "image"),
        (form([b""]), "image"),
        (form([PNG, b""]), "image"),
        (form(mask_file=b""), "mask"),
        (ImageEditForm({}, {"image": [PNG]}), "prompt"),
        (ImageEditForm({"prompt": ["x"]}, {"image": [PNG], "mask": [MASK, MASK]}), "mask"),
    ],
)
def test_missing_or_empty_parts_are_400s_naming_them(the_form: ImageEditForm, param: str) -> None:
    with pytest.raises(APIError) as e:
        parse_image_edit_request(the_form)
    assert (e.value.status, e.value.param) == (400, param)


# ----------------------------------------------------------------------------- over HTTP

MAX_FILE_BYTES = 100


@pytest.fixture
async def client() -> Any:
    async def handler(request: web.Request) -> web.Response:
        req = parse_image_edit_request(await read_image_edit_form(request, max_file_bytes=MAX_FILE_BYTES))
        return web.json_response(
            {"images": [i.decode() for i in req.image], "mask": req.mask and req.mask.decode(), "n": req.n}
        )

    app = web.Application(middlewares=[error_middleware])
    app.router.add_post("/v1/images/edits", handler)
    async with TestClient(TestServer(app)) as c:
        yield c


def _body(*files: tuple[str, bytes], **fields: str) -> aiohttp.FormData:
    data = aiohttp.FormData()
    for name, value in fields.items():
        data.add_field(name, value)
    for name, content in files:
        data.add_field(name, content, filename="f.png", content_type="image/png")
    return data


async def test_image_parts_with_and_without_brackets_and_a_mask(client: TestClient[Any, Any]) -> None:
    r = await client.post("/v1/images/edits", data=_body(("image[]", b"a"), ("image[]", b"b"), ("mask", b"m"), prompt="x", n="2"))
    assert r.status == 200, await r.text()
    assert await r.json() == {"images": ["a", "b"], "mask": "m", "n": 2}
    r = await client.post("/v1/images/edits", data=_body(("image", b"a"), prompt="x"))
    assert (await r.json())["images"] == ["a"]


async def test_a_file_over_the_media_bound_is_a_413_naming_it(client: TestClient[Any, Any]) -> None:
    for name in ("image", "mask"):
        files = [("image", b"a"), (name, b"x" * (MAX_FILE_BYTES + 1))]
        r = await client.post("/v1/images/edits", data=_body(*files, prompt="x"))
        assert r.status == 413
        assert (await r.json())["error"]["param"] == name


async def test_a_json_body_is_a_400(client: TestClient[Any, Any]) -> None:
    r = await client.post("/v1/images/edits", json={"prompt": "x"})
    assert r.status == 400
    assert "multipart/form-data" in (await r.json())["error"]["message"]


def test_priority_is_read_from_its_form_text() -> None:
    assert parse_image_edit_request(form(prompt="x")).priority == 0
    assert parse_image_edit_request(form(prompt="x", priority="-3")).priority == -3
    with pytest.raises(APIError) as e:
        parse_image_edit_request(form(prompt="x", priority="soon"))
    assert e.value.param == "priority"
