"""semantic_vad's end-of-turn probability, the parts that need no model: the transcript read as
words, the rendered prompt cut after the user message's end token, and P(end) from the logprobs
there. The whole question, asked of SmolLM2 through the server, is bench/semantic_vad.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import cast

import pytest

from omni.engines.pool import ModelPool
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.realtime.end_of_turn import TOP, end_of_turn_probability, end_probability, spoken, through_user_end
from omni.shared.protocol import messages as protocol
from omni.text.tokenizer import TextTokenizer
from scheduler.request import Request
from tests.omni.fake_pool import FakePool, FakeStream

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


# ---------------------------------------------------------------- the question, asked of a pool


@dataclass(slots=True)
class PromptLogprobsStream(FakeStream):
    prompt_logprobs: list[protocol.PromptLogprobs] = field(default_factory=list)


@dataclass
class PromptLogprobsPool(FakePool):
    """FakePool whose streams also carry the prompt's logprobs: `end` for the prompt's last
    token, alongside `top` there, and 0.0 for the others."""

    end: float = 0.0
    top: list[tuple[int, float]] = field(default_factory=list)

    def submit(self, request: Request, constraint: object = None) -> PromptLogprobsStream:
        stream = super().submit(request, constraint)
        n = len(request.prompt_token_ids)
        tops: list[list[int]] = [[] for _ in range(n - 2)] + [[t for t, _ in self.top]]
        top_logprobs: list[list[float]] = [[] for _ in range(n - 2)] + [[lp for _, lp in self.top]]
        part = protocol.PromptLogprobs(str(request.request_id), 1, [0.0] * (n - 2) + [self.end], [1] * (n - 1),
                                       tops, top_logprobs)  # fmt: skip
        return PromptLogprobsStream(stream.request, stream.events, [part])


async def test_the_question_is_one_token_after_the_user_message_with_its_logprobs(tokenizer: TextTokenizer) -> None:
    (end,) = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    (question,) = tokenizer.encode("?", add_special_tokens=False)
    pool = PromptLogprobsPool([5], end=math.log(0.05), top=[(question, math.log(0.6)), (end, math.log(0.05))])
    models = ModelRegistry()
    models.add(ServedModel("m", tokenizer, cast(ModelPool, pool), created=0))

    p = await end_of_turn_probability(models, "m", "What is the capital of France?", timeout=None)

    assert p == pytest.approx(0.65)
    (request,) = pool.submitted
    ids = request.prompt_token_ids
    assert ids[-1] == end and end in tokenizer.eos_token_ids  # the user message's own end, nothing after
    assert tokenizer.decode(ids, skip_special_tokens=False).endswith("what is the capital of france<|im_end|>")
    params = request.sampling_params
    assert (params.max_tokens, params.prompt_logprobs, params.temperature) == (1, TOP, 0.0)
