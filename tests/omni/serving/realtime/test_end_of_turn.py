"""semantic_vad's end-of-turn probability, the parts that need no model: the transcript read as
words, the rendered prompt cut after the user message's end token, and P(end) from the logprobs
there. The whole question, asked of SmolLM2 through the server, is bench/semantic_vad.py's."""

from __future__ import annotations

import math

import pytest

from omni.serving.realtime.end_of_turn import end_probability, spoken, through_user_end

END = frozenset({2})
VOCAB = {2: "<|im_end|>", 47: "?", 30: ".", 9148: " ?", 28: ",", 284: " and", 77: "!!", 5: "...", 6: "a."}


def test_a_transcript_is_read_as_lower_case_words() -> None:
    assert spoken("What's the capital of France?") == "what's the capital of france"
    assert spoken("  Well, I'd like - a well-made...   table.") == "well i'd like - a well-made table"


def test_the_prompt_ends_with_the_last_end_token() -> None:
    # <|im_start|>system ... <|im_end|> \n <|im_start|>user \n hi <|im_end|> \n
    assert through_user_end([1, 9, 2, 198, 1, 4093, 198, 6004, 2, 198], END) == [1, 9, 2, 198, 1, 4093, 198, 6004, 2]
    with pytest.raises(ValueError):
        through_user_end([1, 4093, 6004], END)


def test_p_end_adds_the_sentence_final_marks_to_the_end_token() -> None:
    top = [(47, math.log(0.6)), (2, math.log(0.05)), (30, math.log(0.1)), (9148, math.log(0.02)), (28, math.log(0.1)),
           (284, math.log(0.05)), (77, math.log(0.01)), (5, math.log(0.01)), (6, math.log(0.01))]  # fmt: skip
    p = end_probability(math.log(0.05), top, END, VOCAB.__getitem__)
    # <|im_end|> 0.05 (once, though also among top) + "?" + "." + " ?" + "!!" + "..."; not "," " and" "a."
    assert p == pytest.approx(0.05 + 0.6 + 0.1 + 0.02 + 0.01 + 0.01)


def test_p_end_is_at_most_one() -> None:
    assert end_probability(math.log(0.9), [(47, math.log(0.9))], END, VOCAB.__getitem__) == 1.0
