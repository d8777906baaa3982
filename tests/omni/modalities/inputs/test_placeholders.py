"""Placeholders: which item each placeholder token of a rendered prompt belongs to (the k-th of
a component and kind is the k-th item of that kind), the 400s when they do not pair up, and
the code tokens a discrete component's output becomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni.errors import APIError
from omni.modalities.inputs.items import MediaItem
from omni.modalities.inputs.placeholders import PLACEHOLDERS, PlaceholderTokens, code_token, placeholder_ids
from omni.text.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tokens(tiny_tokenizer_dir: Path) -> PlaceholderTokens:
    return PlaceholderTokens(TextTokenizer.from_dir(tiny_tokenizer_dir))


def ids(tokens: PlaceholderTokens, *names: str) -> dict[str, int]:
    found = {n: tokens.tokenizer.token_to_id(n) for n in names}
    assert None not in found.values()
    return found  # type: ignore[return-value]


def item(kind: str, param: str) -> MediaItem:
    return MediaItem(kind, param, b"x")


def test_the_kth_placeholder_of_a_component_is_the_kth_item_of_its_kind(tokens: PlaceholderTokens) -> None:
    pad = ids(tokens, "<|IMAGE_PAD|>", "<|DISCRETE_IMAGE_PAD|>", "<|AUDIO_PAD|>")
    image, discrete, audio = pad["<|IMAGE_PAD|>"], pad["<|DISCRETE_IMAGE_PAD|>"], pad["<|AUDIO_PAD|>"]
    a, b, c = item("image", "m[0].c[0]"), item("audio", "m[0].c[1]"), item("image", "m[1].c[0]")
    # each image rendered twice (embeddings and codes), in message order
    prompt = [1, image, discrete, 2, audio, 3, image, discrete, 4]
    slots = tokens.slots(prompt, [a, b, c])
    assert [(s.pos, s.placeholder.component, s.item.param) for s in slots] == [
        (1, "vision_encoder", "m[0].c[0]"),
        (2, "image_tokenizer", "m[0].c[0]"),
        (4, "audio_encoder", "m[0].c[1]"),
        (6, "vision_encoder", "m[1].c[0]"),
        (7, "image_tokenizer", "m[1].c[0]"),
    ]
    assert [s.placeholder.discrete for s in slots] == [False, True, False, False, True]
    assert tokens.slots([1, 2, 3], []) == []


def test_a_placeholder_typed_in_the_text_is_a_400(tokens: PlaceholderTokens) -> None:
    image = ids(tokens, "<|IMAGE_PAD|>")["<|IMAGE_PAD|>"]
    with pytest.raises(APIError) as refused:
        tokens.slots([image, 5, image], [item("image", "m[0].c[0]")])
    assert (refused.value.status, refused.value.param) == (400, "messages")
    assert "more image placeholders than image inputs" in str(refused.value)


def test_an_item_the_template_does_not_render_is_a_400_naming_it(tokens: PlaceholderTokens) -> None:
    image = ids(tokens, "<|IMAGE_PAD|>")["<|IMAGE_PAD|>"]
    with pytest.raises(APIError) as refused:
        tokens.slots([image], [item("image", "m[0].c[0]"), item("audio", "m[0].c[1]")])
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, "m[0].c[1]", "unsupported_content_type")
    assert "does not render audio input" in str(refused.value)


def test_codes_become_their_vocabulary_tokens(tokens: PlaceholderTokens) -> None:
    assert (code_token("image_tokenizer", 12), code_token("audio_tokenizer", 7)) == ("<|vision00012|>", "<|audio0007|>")
    tokenizer = tokens.tokenizer
    assert tokens.code_id("image_tokenizer", 12) == tokenizer.token_to_id("<|vision00012|>")
    assert tokens.code_id("audio_tokenizer", 63) == tokenizer.token_to_id("<|audio0063|>")
    assert tokens.code_id("audio_tokenizer", 63) == tokens.code_id("audio_tokenizer", 63)  # cached, the same
    with pytest.raises(APIError) as missing:
        tokens.code_id("audio_tokenizer", 64)  # the tiny vocabulary has 64 audio units
    assert missing.value.status == 500
    assert tokens.missing_code_token("audio_tokenizer", 64) is None
    assert tokens.missing_code_token("audio_tokenizer", 65) == "<|audio0064|>"


def test_the_placeholder_ids_are_those_the_vocabulary_has(tokens: PlaceholderTokens) -> None:
    expected = {tokens.tokenizer.token_to_id(name) for name in PLACEHOLDERS} - {None}
    assert placeholder_ids(tokens.tokenizer) == expected and len(expected) == 5
