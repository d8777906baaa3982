"""The /tokenize and /detokenize bodies: each form parses into its Struct, and a malformed body
is a 400 naming its field (the handler's own tests cover them over HTTP)."""

from __future__ import annotations

from typing import Any

import pytest

from omni.errors import APIError
from omni.serving.requests.tokenize import (
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    parse_detokenize_request,
    parse_tokenize_request,
)

HI = [{"role": "user", "content": "hi"}]


def test_the_prompt_form_and_its_defaults() -> None:
    req = parse_tokenize_request({"prompt": "a", "model": None})
    assert req == TokenizeCompletionRequest(prompt="a")
    assert (req.add_special_tokens, req.return_token_strs) == (True, False)


def test_the_chat_form_passes_the_template_fields_on() -> None:
    req = parse_tokenize_request({"messages": HI, "add_generation_prompt": False, "return_token_strs": True})
    assert isinstance(req, TokenizeChatRequest) and req.return_token_strs
    assert req.chat_body("m") == {"model": "m", "messages": HI, "add_generation_prompt": False}


def test_detokenize() -> None:
    assert parse_detokenize_request({"tokens": [0, 5]}).tokens == [0, 5]


@pytest.mark.parametrize(
    ("parse", "body", "param", "words"),
    [
        (parse_tokenize_request, {}, "prompt", "Missing"),
        (parse_tokenize_request, {"prompt": 3}, "prompt", "a string"),
        (parse_tokenize_request, {"prompt": "a", "messages": HI}, "prompt", "either"),
        (parse_tokenize_request, {"prompt": "a", "tools": []}, "tools", "fields: add_special_tokens"),
        (parse_tokenize_request, {"messages": HI, "add_special_tokens": True}, "add_special_tokens", "template"),
        (parse_tokenize_request, {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens", "a boolean"),
        (parse_detokenize_request, {}, "tokens", "Missing"),
        (parse_detokenize_request, {"tokens": [1, "2"]}, "tokens", "an integer"),
        (parse_detokenize_request, {"tokens": [-1]}, "tokens", "at least 0"),
        (parse_detokenize_request, {"tokens": [1], "prompt": "x"}, "prompt", "not a field"),
    ],
)
def test_a_malformed_body_is_a_400_naming_its_field(parse: Any, body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(APIError) as e:
        parse(body)
    assert (e.value.status, e.value.param) == (400, param)
    assert words in e.value.message, e.value.message
