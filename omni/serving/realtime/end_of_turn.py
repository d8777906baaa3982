"""semantic_vad's question to the LLM: how likely is the user's turn to end with what they said
so far? As turn-detector models ask it (LiveKit's turn detector, say): the conversation's user
message rendered by the model's own chat template with the transcript so far as its text, and
the probability of the token that closes a user message (the template's end token, <|im_end|>)
right after it, read from the prompt's logprobs in one prefill on the worker.

    ...<|im_start|>user\\n{what was said so far}<|im_end|>
                                               ^ P(end) read here, with the top 20 there

The transcript is read as spoken words: lower case, no punctuation (a transcriber's full stop
at the end of a clip would answer the question for the model). An untuned chat model then puts
most of a finished sentence's mass on the punctuation that closes it ("?" after "what is the
capital of france"), not on the end token: P(end) is the end token's probability plus the
sentence-final marks' (. ? !) among the top 20, each taken as closing the message.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Callable, Sequence
from contextlib import aclosing

from omni.serving.completions import completion
from omni.serving.model import ModelRegistry
from omni.serving.realtime.input_transcription import transcribe
from omni.serving.requests import parse_completion_request
from omni.serving.sampling import voice_priority

log = logging.getLogger("omni.serving.realtime")

TOP = 20  # the alternatives read at the end position (the server's default --max-logprobs)
_NOT_SPOKEN = re.compile(r"[^\w\s'-]+")
_FINAL = re.compile(r"^\s*[.?!]+\s*$")


def spoken(text: str) -> str:
    """A transcript as words only: lower case, no punctuation but apostrophes and hyphens."""
    return " ".join(_NOT_SPOKEN.sub(" ", text.lower()).split())


def through_user_end(token_ids: Sequence[int], end_ids: frozenset[int]) -> list[int]:
    """The rendered conversation up to and including the end token of its last message (the
    user's): what a template adds after it (a newline) is cut."""
    last = max((i for i, t in enumerate(token_ids) if t in end_ids), default=None)
    if last is None:
        raise ValueError("the chat template closes no message with an end token")
    return list(token_ids[: last + 1])


def end_probability(
    token_logprob: float, top: Sequence[tuple[int, float]], end_ids: frozenset[int], decode: Callable[[int], str]
) -> float:
    """P(end) at the position before the user message's end token: that token's probability
    (token_logprob) plus those of the sentence-final marks among top."""
    p = math.exp(token_logprob)
    for token_id, logprob in top:
        if token_id not in end_ids and _FINAL.match(decode(token_id)):
            p += math.exp(logprob)
    return min(p, 1.0)


async def end_of_turn_probability(models: ModelRegistry, model_name: str, said: str, *, timeout: float | None) -> float:
    """P(the user's turn ends after `said`), by the served model model_name."""
    model = models.get(model_name)
    tokenizer = model.tokenizer
    messages = [{"role": "user", "content": spoken(said)}]
    rendered = await asyncio.to_thread(
        tokenizer.apply_chat_template, messages, add_generation_prompt=False,
        chat_template=model.chat_format.chat_template, enable_thinking=False, skip_reasoning=True,
    )  # fmt: skip
    ids = through_user_end(rendered, tokenizer.eos_token_ids)
    body = {"model": model_name, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": TOP,
            "priority": voice_priority(model.pool.config.llm)}  # fmt: skip
    run = await completion(models, parse_completion_request(body), timeout=timeout)
    generation = run.generations[0]
    with run.admitted():
        async with aclosing(run.outputs[0].deltas()) as deltas:
            async for _ in deltas:
                pass
    assert generation.prompt_logprobs is not None  # asked for: known once the first delta is out
    last = generation.prompt_logprobs[-1]
    assert last is not None  # the prompt has more than one token
    return end_probability(last.logprob, last.top, tokenizer.eos_token_ids, lambda t: tokenizer.decode([t]))


async def pause_score(
    models: ModelRegistry, model_name: str, wav: bytes, language: str | None, *, timeout: float | None
) -> float | None:
    """A pause's P(end): the speech so far (wav) transcribed as the session transcribes its turns,
    then scored by the same model. None when either fails: the turn goes on, ended by silence alone."""
    try:
        said, _ = await transcribe(models, models.get(model_name), wav, language=language, timeout=timeout)
        return await end_of_turn_probability(models, model_name, said, timeout=timeout)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - a pause unscored is a turn that waits, not a session that fails
        log.warning("realtime: semantic_vad could not score a pause", exc_info=True)
        return None
