import re

import pytest

from omni.shared.store.base import MAX_KEY_LENGTH, validate_key
from omni.shared.store.keys import encoder_key, output_key


@pytest.mark.parametrize("key", ["a", "enc/llm/v1/" + "0" * 64, "out/image/x.png", "A-b_c.d/e"])
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    "key",
    [
        *["", "/a", "a/", "a//b", "..", "a/../b", "./a", "a/.tmp-x"],
        *["a\\b", "a?b", "a%2fb", "é", "a\nb"],
    ],
)
def test_invalid_keys(key: str) -> None:
    with pytest.raises(ValueError):
        validate_key(key)


def test_key_length_limit() -> None:
    assert validate_key("a" * MAX_KEY_LENGTH)
    with pytest.raises(ValueError, match="longer"):
        validate_key("a" * (MAX_KEY_LENGTH + 1))


def test_encoder_key_is_content_addressed() -> None:
    params = {"max_pixels": 1024, "fps": 2.0}
    key = encoder_key("vision_encoder", "rev1", b"image bytes", params)
    assert re.fullmatch(r"enc/vision_encoder/rev1/[0-9a-f]{64}", key)
    # Same media and params (in any order) -> same key.
    reordered = {"fps": 2.0, "max_pixels": 1024}
    assert key == encoder_key("vision_encoder", "rev1", b"image bytes", reordered)
    # Anything different -> a different key.
    assert key != encoder_key("vision_encoder", "rev1", b"image bytes!", params)
    assert key != encoder_key("vision_encoder", "rev1", b"image bytes", {**params, "fps": 1.0})
    assert key != encoder_key("vision_encoder", "rev2", b"image bytes", params)
    assert key != encoder_key("audio_encoder", "rev1", b"image bytes", params)


def test_encoder_key_boundary_between_media_and_params_is_unambiguous() -> None:
    # Without the length prefix these two would hash the same byte string.
    a = encoder_key("c", "r", b'x{"a":1}', {})
    b = encoder_key("c", "r", b"x", {"a": 1})
    assert a != b


@pytest.mark.parametrize("component,revision", [("a/b", "r"), ("c", "../r"), ("", "r"), ("c", "")])
def test_encoder_key_rejects_bad_segments(component: str, revision: str) -> None:
    with pytest.raises(ValueError):
        encoder_key(component, revision, b"", {})


def test_encoder_key_rejects_non_json_params() -> None:
    with pytest.raises((TypeError, ValueError)):
        encoder_key("c", "r", b"", {"x": object()})
    with pytest.raises(ValueError):
        encoder_key("c", "r", b"", {"x": float("nan")})


def test_output_key() -> None:
    a, b = output_key("image", "png"), output_key("image", "png")
    assert re.fullmatch(r"out/image/[0-9a-f]{32}\.png", a)
    assert a != b
    for kind, ext in [("im/age", "png"), ("image", "p.ng"), ("image", ""), ("..", "png")]:
        with pytest.raises(ValueError):
            output_key(kind, ext)
