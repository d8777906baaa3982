"""Fitting a parsed request to one prompt and the model: the prompt's truncation, the media
spans it moves, and the one place a request's sampling fields become the scheduler's
SamplingParams."""

from __future__ import annotations

import dataclasses
from typing import Any

from omni.config import LLMConfig
from omni.errors import bad_request
from omni.serving.requests.common import GenerationFields
from omni.serving.requests.fields import unsupported, value_error
from omni.shared.sampling_bounds import MAX_PROMPT_LOGPROBS
from omni.text.tokenizer import TextTokenizer
from scheduler.request import MediaSpan, SamplingParams


def _check_in_vocabulary(param: str, token_ids: tuple[int, ...], vocab_size: int) -> None:
    bad = next((t for t in token_ids if t >= vocab_size), None)
    if bad is not None:
        raise value_error(
            param, f"token id {bad} is out of range for a vocabulary of {vocab_size}."
        )


def bad_words_token_ids(
    bad_words: tuple[str, ...], tokenizer: TextTokenizer
) -> tuple[tuple[int, ...], ...]:
    """Each bad word's token sequences, as vLLM makes them: the word as it would start the
    text, and also as it would follow a space when that gives a different first token in as
    many tokens (a word mid-text usually tokenizes with its leading space)."""
    sequences: list[tuple[int, ...]] = []
    for word in bad_words:
        bare = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        sequences.append(bare)
        if spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    return tuple(sequences)


def truncate_prompt(
    token_ids: list[int], request: GenerationFields, max_model_len: int
) -> list[int]:
    """The prompt's last truncate_prompt_tokens tokens (-1: the last max_model_len), as vLLM
    keeps them; the whole prompt when the request does not ask. For chat, call it on the
    rendered template's token ids (and move the media spans with truncated_media)."""
    limit = request.truncate_prompt_tokens
    if limit is None:
        return token_ids
    if limit == -1:
        limit = max_model_len
    return token_ids[-limit:] if len(token_ids) > limit else token_ids


def truncated_media(media: tuple[MediaSpan, ...], num_cut: int) -> tuple[MediaSpan, ...]:
    """The media spans of a prompt whose first num_cut tokens truncate_prompt dropped, at their
    new offsets. A span the cut goes through cannot be injected in part: a 400."""
    kept = []
    for span in media:
        if span.end <= num_cut:
            continue  # wholly cut: its item is not in the prompt any more
        if span.offset < num_cut:
            raise value_error(
                "truncate_prompt_tokens",
                f"keeping the last tokens would cut a media item's {span.num_rows} embedding rows "
                f"at prompt positions {span.offset}..{span.end - 1}; keep more tokens or none of it.",
            )
        kept.append(MediaSpan(span.offset - num_cut, span.num_rows, span.key))
    return tuple(kept)


def check_priority(priority: int, scheduling_policy: str) -> None:
    """Under fcfs a non-zero priority is vLLM's 400 naming the field."""
    if priority != 0 and scheduling_policy != "priority":
        raise unsupported(
            "priority",
            f"Priority scheduling is not enabled (the server runs --scheduling-policy {scheduling_policy}); "
            f"only 0 is accepted, got {priority}.",
        )


def voice_priority(llm: LLMConfig) -> int:
    """What a Realtime session asks of the workers runs at (its responses, transcriptions, pause
    scoring, images encoded ahead), and speech that sends none: --voice-priority under the
    priority policy, 0 (the only one fcfs takes) otherwise."""
    return llm.voice_priority if llm.scheduling_policy == "priority" else 0


def request_priority(llm: LLMConfig, sent: int | None, *, voice: bool = False) -> int:
    """The priority a request is served at: the one it sent (checked against the policy); else
    a voice request's (voice_priority); else 0."""
    if sent is not None:
        check_priority(sent, llm.scheduling_policy)
        return sent
    return voice_priority(llm) if voice else 0


def sampling_params(
    request: GenerationFields,
    *,
    num_prompt_tokens: int,
    max_model_len: int,
    tokenizer: TextTokenizer,
    stop_token_ids: tuple[int, ...] = (),
    max_logprobs: int = MAX_PROMPT_LOGPROBS,
    scheduling_policy: str = "fcfs",
) -> SamplingParams:
    """Fit the request to one prompt of num_prompt_tokens tokens and the model's vocabulary.

    The one place a request's sampling fields become the scheduler's SamplingParams.

    positions: 0 ........ num_prompt_tokens ........ max_model_len
               [ prompt  ][ at most max_model_len - num_prompt_tokens new tokens ]
    """
    prompt_param = request.prompt_param
    if num_prompt_tokens <= 0:
        raise value_error(prompt_param, "the prompt is empty (it encodes to no tokens).")
    room = max_model_len - num_prompt_tokens
    if room <= 0:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"{prompt_param} resulted in {num_prompt_tokens} tokens, which leaves no room for "
            f"the completion. Please reduce the length of the {prompt_param}.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    for field_name, asked in (
        (request.logprobs_param, request.num_logprobs),
        ("prompt_logprobs", request.num_prompt_logprobs),
    ):
        if asked is not None and asked > max_logprobs:
            raise bad_request(
                f"'{field_name}' asks for {asked} logprobs; this server gives at most {max_logprobs} "
                "(--max-logprobs).",
                param=field_name,
            )
    check_priority(request.priority, scheduling_policy)
    vocab_size = tokenizer.num_token_ids
    _check_in_vocabulary("logit_bias", tuple(t for t, _ in request.logit_bias), vocab_size)
    _check_in_vocabulary("allowed_token_ids", request.allowed_token_ids or (), vocab_size)
    _check_in_vocabulary("stop_token_ids", request.stop_token_ids, vocab_size)
    bad_words = bad_words_token_ids(request.bad_words, tokenizer)
    _check_in_vocabulary("bad_words", tuple(t for word in bad_words for t in word), vocab_size)
    max_tokens = request.max_tokens
    if max_tokens is not None and max_tokens > room:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in "
            f"the {prompt_param}, {max_tokens} in the completion). Please reduce the "
            f"length of the {prompt_param} or the completion.",
            param=request.max_tokens_param,
            code="context_length_exceeded",
        )
    derived: dict[str, Any] = {
        "max_tokens": room if max_tokens is None else max_tokens,
        "logprobs": request.num_logprobs,
        "stop_token_ids": request.stop_token_ids + stop_token_ids,
        "bad_words_token_ids": bad_words,
        "prompt_logprobs": request.num_prompt_logprobs,
    }
    # Every other field is the request's field of the same name: a new sampling field needs no
    # line here (test_sampling checks each field is one or the other).
    return SamplingParams(**derived, **{name: getattr(request, name) for name in COPIED_FIELDS})


# SamplingParams' fields a request holds under the same name and meaning.
COPIED_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(SamplingParams)
    if f.name not in {"max_tokens", "logprobs", "stop_token_ids", "bad_words_token_ids", "prompt_logprobs"}
)
