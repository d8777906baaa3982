"""ChatFormat: the parsers a model's replies are read with, taken from its chat template
unless named, and the reference's spoken markup recognised by its template and vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni.text.chat_format import ChatFormat, detect_reasoning_parser, detect_spoken_markup, detect_tool_parser
from omni.text.tokenizer import TextTokenizer

HERMES = "{% for m in messages %}<tool_call>{{ m.content | tojson }}</tool_call>{% endfor %}"
REFERENCE = "<think></think><tool_call>name<arg_key>k</arg_key></tool_call><|image_meta_duration|>"


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def test_the_template_shows_which_parsers_read_its_replies() -> None:
    assert detect_tool_parser(HERMES) == "hermes"
    assert detect_tool_parser(REFERENCE) == "hyperclovax"
    assert detect_tool_parser("{{ messages }}") is None
    assert detect_reasoning_parser(REFERENCE) == "think"
    assert detect_reasoning_parser(HERMES) is None


def test_auto_is_what_the_template_shows_and_none_turns_a_parser_off(tokenizer: TextTokenizer) -> None:
    fmt = ChatFormat.resolve(tokenizer, chat_template=REFERENCE)
    assert (fmt.tool_parser, fmt.reasoning_parser, fmt.chat_template) == ("hyperclovax", "think", REFERENCE)
    off = ChatFormat.resolve(tokenizer, tool_parser="none", reasoning_parser="none", chat_template=REFERENCE)
    assert (off.tool_parser, off.reasoning_parser) == (None, None)
    named = ChatFormat.resolve(tokenizer, tool_parser="hermes", chat_template="{{ messages }}")
    assert (named.tool_parser, named.reasoning_parser) == ("hermes", None)


def test_an_unknown_parser_name_is_refused_listing_the_known(tokenizer: TextTokenizer) -> None:
    with pytest.raises(ValueError, match=r"unknown parser 'nope'; known: .*hermes.*auto, none"):
        ChatFormat.resolve(tokenizer, tool_parser="nope")
    with pytest.raises(ValueError, match="unknown parser 'deep'"):
        ChatFormat.resolve(tokenizer, reasoning_parser="deep")


def test_the_checkpoints_own_template_is_read_when_none_is_given(tokenizer: TextTokenizer) -> None:
    # the tiny tokenizer's template writes the reference's calls and reasoning, but not its
    # media placeholders: no spoken markup
    assert ChatFormat.resolve(tokenizer) == ChatFormat(tool_parser="hyperclovax", reasoning_parser="think")
    assert ChatFormat.resolve(tokenizer, chat_template=HERMES, auto_tool_choice=False, trust_request_chat_template=True) == (
        ChatFormat("hermes", None, False, HERMES, True)
    )


def test_spoken_markup_needs_the_references_template_and_its_vocabulary(tokenizer: TextTokenizer) -> None:
    assert tokenizer.token_to_id("<assistant_transcript>") is not None
    assert detect_spoken_markup(tokenizer, REFERENCE) is True
    assert ChatFormat.resolve(tokenizer, chat_template=REFERENCE).spoken_markup
    assert detect_spoken_markup(tokenizer, HERMES) is False  # the tags alone do not make the dialect
