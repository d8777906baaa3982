"""ChatEncoder escapes a long client string a window at a time, with the same result as one
regex call over it: a special token across a window's end, or a short token that is the prefix
of a longer one there, is decided by the next window."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from omni.text import chat_encoder
from omni.text.tokenizer import TextTokenizer

WINDOW = 64


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def test_windows_escape_as_one_call(tokenizer: TextTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = tokenizer.chat_encoder
    specials = [str(tokenizer.backend.id_to_token(i)) for i in sorted(tokenizer.special_token_ids)]
    # Prefixes of tokens (<|im_start| without its bar) and tokens sharing prefixes, at every offset.
    words = specials + [t[:-1] for t in specials] + ["<", "|", "x", "é", chat_encoder.ESC]
    rng = random.Random(0)
    texts = ["".join(rng.choice(words) for _ in range(rng.randrange(20, 200))) for _ in range(200)]
    texts += ["y" * shift + "".join(specials) * 3 for shift in range(40)]
    whole = encoder._escape_all(texts)  # each shorter than the default window: one call each
    monkeypatch.setattr(chat_encoder, "_ESCAPE_WINDOW", WINDOW)
    assert max(map(len, specials)) < WINDOW
    assert encoder._escape_all(texts) == whole
    assert any(len(t) > 2 * WINDOW for t in texts)


def test_a_long_string_without_specials_is_not_copied(
    tokenizer: TextTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chat_encoder, "_ESCAPE_WINDOW", WINDOW)
    text = "plain text " * 100
    assert tokenizer.chat_encoder._escape_all([text])[0] is text
