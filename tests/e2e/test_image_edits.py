"""POST /v1/images/edits end to end, with the official openai client's images.edit against the
session's omni server (the tiny checkpoint in the published layout): one image and two, with
and without a mask, at the input's size and at an asked one, streamed; every pixel outside the
mask is the input's; and the bad parts are 400s naming them."""

from __future__ import annotations

import base64
import io
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from tests.e2e.conftest import DIFFUSION_STEPS

MODEL = "omni"
PROMPT = "make the sky purple"
W, H = 96, 64  # the input: not a size of the decoder's table


@pytest.fixture(scope="module")
def server(speaking_server: str) -> str:
    return speaking_server  # the session's omni server (tests/e2e/conftest.py)


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _picture(seed: int, size: tuple[int, int] = (W, H)) -> bytes:
    """A noisy RGB picture: every pixel differs from its neighbours, so a kept pixel is not luck."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return _png(Image.fromarray(pixels))


def _mask(size: tuple[int, int] = (W, H)) -> tuple[bytes, np.ndarray]:
    """RGBA: the left half fully transparent (to change), the rest opaque or half transparent
    (kept). Returns the PNG and where the input is kept."""
    alpha = np.full((size[1], size[0]), 255, dtype=np.uint8)
    alpha[:, : size[0] // 2] = 0
    alpha[: size[1] // 4, size[0] // 2 :] = 128  # partly transparent: kept too
    rgba = np.zeros((size[1], size[0], 4), dtype=np.uint8)
    rgba[..., 3] = alpha
    return _png(Image.fromarray(rgba, "RGBA")), alpha > 0


def _decoded(b64: str | None) -> Image.Image:
    assert b64 is not None
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    return image


def _edit(base: str, image: Any, **kwargs: Any) -> Any:
    extra = {"seed": 4, "num_inference_steps": DIFFUSION_STEPS, **kwargs.pop("extra_body", {})}
    return _client(base).images.edit(
        model=MODEL, image=image, prompt=PROMPT, response_format="b64_json", extra_body=extra, **kwargs
    )


def test_one_image_without_a_mask_comes_back_at_its_size_or_the_asked_one(server: str) -> None:
    result = _edit(server, ("in.png", _picture(1), "image/png"))
    assert result.data is not None and len(result.data) == 1
    assert _decoded(result.data[0].b64_json).size == (W, H)  # size auto: the input's
    assert result.size == f"{W}x{H}" and result.output_format == "png"
    assert result.usage is not None and result.usage.input_tokens_details.image_tokens > 0  # the picture is in
    asked = _edit(server, ("in.png", _picture(1), "image/png"), size="1024x576", n=2)
    assert asked.data is not None and len(asked.data) == 2
    assert all(_decoded(d.b64_json).size == (1024, 576) for d in asked.data)


def test_a_mask_keeps_every_pixel_outside_it(server: str) -> None:
    picture = _picture(2)
    mask, kept = _mask()
    result = _edit(server, ("in.png", picture, "image/png"), mask=("mask.png", mask, "image/png"))
    assert result.data is not None
    out = np.asarray(_decoded(result.data[0].b64_json).convert("RGB"))
    source = np.asarray(Image.open(io.BytesIO(picture)).convert("RGB"))
    assert out.shape == source.shape
    assert (out[kept] == source[kept]).all()  # exactly: worst difference 0
    assert (out[~kept] != source[~kept]).any()  # the masked half was drawn anew


def test_a_mask_at_an_asked_size_keeps_the_resized_input(server: str) -> None:
    picture = _picture(3)
    mask, kept = _mask()
    result = _edit(server, ("in.png", picture, "image/png"), mask=("mask.png", mask, "image/png"), size="768x768")
    assert result.data is not None
    out = np.asarray(_decoded(result.data[0].b64_json).convert("RGB"))
    resized = np.asarray(Image.open(io.BytesIO(picture)).convert("RGB").resize((768, 768), Image.Resampling.LANCZOS))
    keep = np.asarray(Image.fromarray(kept.astype(np.uint8) * 255).resize((768, 768), Image.Resampling.NEAREST)) > 0
    assert out.shape == (768, 768, 3)
    assert (out[keep] == resized[keep]).all()


def test_two_images_with_a_mask_on_the_first(server: str) -> None:
    picture = _picture(4)
    mask, kept = _mask()
    images = [("a.png", picture, "image/png"), ("b.png", _picture(5, (40, 40)), "image/png")]
    one = _edit(server, images[:1])
    two = _edit(server, images, mask=("mask.png", mask, "image/png"))
    assert two.data is not None and one.usage is not None and two.usage is not None
    assert two.usage.input_tokens_details.image_tokens > one.usage.input_tokens_details.image_tokens  # both seen
    out = np.asarray(_decoded(two.data[0].b64_json).convert("RGB"))
    source = np.asarray(Image.open(io.BytesIO(picture)).convert("RGB"))
    assert out.shape == source.shape and (out[kept] == source[kept]).all()


def test_streamed_edits_send_partials_then_the_image(server: str) -> None:
    mask, _ = _mask()
    stream = _client(server).images.edit(
        model=MODEL, image=("in.png", _picture(6), "image/png"), prompt=PROMPT, mask=("m.png", mask, "image/png"),
        stream=True, partial_images=2, extra_body={"seed": 4, "num_inference_steps": 4},
    )  # fmt: skip
    events = list(stream)
    assert [e.type for e in events] == ["image_edit.partial_image"] * 2 + ["image_edit.completed"]
    assert all(_decoded(e.b64_json).size == (W, H) for e in events)
    assert events[-1].size == f"{W}x{H}"


def _post(base: str, files: list[tuple[str, tuple[str, bytes, str]]], **fields: str) -> httpx.Response:
    data = {"model": MODEL, "prompt": PROMPT, **fields}
    return httpx.post(f"{base}/v1/images/edits", data=data, files=files, timeout=120)


@pytest.mark.parametrize(
    "case, param",
    [
        ("not an image", "image"),
        ("mask of another size", "mask"),
        ("mask without alpha", "mask"),
        ("mask not a png", "mask"),
        ("no prompt", "prompt"),
        ("no image", "image"),
        ("bad size", "size"),
        ("n 0", "n"),
        ("gif", "output_format"),
        ("unknown field", "colour"),
    ],
)
def test_bad_parts_are_400s_naming_them(server: str, case: str, param: str) -> None:
    image = ("image", ("in.png", _picture(7), "image/png"))
    files, fields = [image], {}
    if case == "not an image":
        files = [("image", ("in.png", b"\x89PNG\r\n\x1a\nnot really", "image/png"))]
    elif case == "mask of another size":
        files.append(("mask", ("m.png", _mask((W + 1, H))[0], "image/png")))
    elif case == "mask without alpha":
        files.append(("mask", ("m.png", _picture(8), "image/png")))
    elif case == "mask not a png":
        buf = io.BytesIO()
        Image.new("RGB", (W, H)).save(buf, format="JPEG")
        files.append(("mask", ("m.jpg", buf.getvalue(), "image/jpeg")))
    elif case == "no image":  # (a form with a part, so that it is multipart)
        files = [("mask", ("m.png", _mask()[0], "image/png"))]
    extra = {"bad size": {"size": "1000x1000"}, "n 0": {"n": "0"}, "gif": {"output_format": "gif"}}
    fields = extra.get(case, {"colour": "red"} if case == "unknown field" else {})
    if case == "no prompt":
        r = httpx.post(f"{server}/v1/images/edits", data={"model": MODEL}, files=files, timeout=120)
    else:
        r = _post(server, files, **fields)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
