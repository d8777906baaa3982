"""SpokenMarkupParser: the reference's spoken-answer markup leaves the content, and parse()
agrees with push()/finish() for every chunking (chunks of 1, 2, 3 and 7 characters)."""

from __future__ import annotations

import pytest

from omni.text.parsers.spoken import SpokenMarkupParser

CASES = [
    # (text, spoke, what the client sees)
    ('<user_transcript>Hi there</user_transcript>\n<assistant_transcript>Hello! How are you?</assistant_transcript>\n'
     '<audio_decoder_call><speaker_info>{"gender": "f"}</speaker_info>', True, "Hello! How are you?"),
    ('<assistant_transcript>B</assistant_transcript>\n<audio_decoder_call>\n<speaker_info>{"a": 1}</speaker_info>\n'
     "<discrete_audio></discrete_audio>\n</audio_decoder_call>", True, "B"),
    ('Answer text.\n\n{"gender": "m", "age": "20-30"}\n\n', True, "Answer text."),
    ('Answer text.\n\n{"gender": "m"}', True, "Answer text."),
    # the legacy speaker info only when audio came out; JSON inside the text is text
    ('Answer text.\n\n{"gender": "m"}\n\n', False, 'Answer text.\n\n{"gender": "m"}'),
    ("a < b and c\n\n{x} more", True, "a < b and c\n\n{x} more"),
    # a t2i call no tool parser read: its markup goes, the text around it stays
    ("Here.\n<tool_call>t2i_model_generation\n<arg_key>discrete_image_token</arg_key>\n<arg_value>\n</arg_value>\n"
     "</tool_call> done", False, "Here. done"),
    ("<tool_call>other</tool_call>", False, "<tool_call>other</tool_call>"),
    ("  plain  answer \n", False, "plain  answer"),
    ("<user_transcript>cut short", True, ""),
]  # fmt: skip


@pytest.mark.parametrize(("text", "spoke", "expected"), CASES)
def test_markup_leaves_the_content_whatever_the_chunking(text: str, spoke: bool, expected: str) -> None:
    assert SpokenMarkupParser().parse(text, spoke=spoke) == expected
    for n in (1, 2, 3, 7):
        parser = SpokenMarkupParser()
        pieces = [parser.push(text[i : i + n]) for i in range(0, len(text), n)] + [parser.finish(spoke=spoke)]
        assert "".join(pieces) == expected, n
