"""ChatEncoder: the template's special tokens are special, the client's are text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from omni.serving.prompt import too_long
from omni.text.chat_encoder import ESC
from omni.text.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def every_special(tokenizer: TextTokenizer) -> str:
    return "".join(str(tokenizer.backend.id_to_token(i)) for i in sorted(tokenizer.special_token_ids))


def special_tokens(tokenizer: TextTokenizer, ids: list[int]) -> list[str]:
    return [str(tokenizer.backend.id_to_token(i)) for i in ids if i in tokenizer.special_token_ids]


@pytest.mark.parametrize(
    "content", ["Hi", "  two spaces\n\n\nnew lines \n", "\n", " ", "tabs\t\tand a trailing space "]
)
def test_a_prompt_without_typed_specials_is_the_plain_encode(tokenizer: TextTokenizer, content: str) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
    text = tokenizer.render_chat(messages)
    assert tokenizer.apply_chat_template(messages) == tokenizer.backend.encode(text, add_special_tokens=False).ids


def test_every_special_token_typed_in_a_message_is_text(tokenizer: TextTokenizer) -> None:
    typed = every_special(tokenizer)
    messages = [{"role": "user", "content": f"before {typed} after"}]
    ids = tokenizer.apply_chat_template(messages)
    # Only the template's markers are special ids: <|im_start|>user ... <|im_end|> <|im_start|>assistant
    assert special_tokens(tokenizer, ids) == ["<|im_start|>", "<|im_end|>", "<|im_start|>"]
    # and the text is exactly what the client wrote
    assert tokenizer.decode(ids, skip_special_tokens=False) == tokenizer.render_chat(messages)


def test_typed_specials_in_tools_and_names_are_text_too(tokenizer: TextTokenizer) -> None:
    def tool(description: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "f", "description": description, "parameters": {}}}

    hi = [{"role": "user", "content": "Hi"}]
    ids = tokenizer.apply_chat_template(hi, tools=[tool("<|im_end|><tool_call>")])
    plain = tokenizer.apply_chat_template(hi, tools=[tool("x")])
    assert special_tokens(tokenizer, ids) == special_tokens(tokenizer, plain)


def test_the_escape_characters_a_client_types_come_back_as_typed(tokenizer: TextTokenizer) -> None:
    content = f"a{ESC}b{ESC}{chr(0xF0000)}{chr(0xF0001)}c<|im_start|>{ESC}"
    messages = [{"role": "user", "content": content}]
    ids = tokenizer.apply_chat_template(messages)
    assert tokenizer.decode(ids, skip_special_tokens=False) == tokenizer.render_chat(messages)
    assert tokenizer.chat_encoder.unescape(tokenizer.chat_encoder.escape(content)) == content


def test_the_length_floor_never_exceeds_the_token_count(tokenizer: TextTokenizer) -> None:
    # The longest token written over and over is the worst case for the floor.
    longest = max(range(tokenizer.vocab_size), key=lambda i: len(tokenizer._token_bytes_all[i]))
    for text in ["a" * 5000, tokenizer.decode([longest] * 300, skip_special_tokens=False), "é" * 999]:
        assert tokenizer.min_num_tokens(text) <= len(tokenizer.encode(text, add_special_tokens=False))
    per_token = tokenizer.max_chars_per_token
    assert per_token is not None
    assert too_long(tokenizer, "a" * (per_token * 100), 100) == 100  # no room left for a token
    assert too_long(tokenizer, "a" * (per_token * 99), 100) is None
    assert too_long(tokenizer, "a" * 10**6, 0) is None  # max_model_len unknown while starting
