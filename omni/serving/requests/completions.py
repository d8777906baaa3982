"""The body of POST /v1/completions: one or more prompts, as text or token ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from omni.errors import bad_request
from omni.serving.requests.fields import (
    Body,
    GenerationFields,
    Json,
    missing,
    opt_bool,
    opt_int,
    parse_generation_fields,
    required_str,
    type_error,
    value_error,
)
from omni.serving.requests.dispositions import check_fields
from omni.serving.requests.structured import parse_grammar
from omni.text.constrained.spec import GrammarSpec

MAX_COMPLETION_LOGPROBS = 5
# Token ids (or prompts) in one request, in all: a million-token context's prompt fits, and a
# 60 MB body of 8 million ids is refused before it is copied, checked and freed at length.
MAX_PROMPT_ITEMS = 1 << 20

Prompt: TypeAlias = str | tuple[int, ...]


def _parse_prompts(body: Body) -> tuple[Prompt, ...]:
    if body.get("prompt") is None:
        raise missing("prompt")
    raw = body["prompt"]
    expected = "a string, an array of strings, an array of token ids or an array of token id arrays"
    if isinstance(raw, str):
        return (raw,)
    if not isinstance(raw, list):
        raise type_error("prompt", expected, raw)
    if not raw:
        raise value_error("prompt", "must not be empty.")
    items = len(raw) + sum(len(p) for p in raw if isinstance(p, list))
    if items > MAX_PROMPT_ITEMS:
        raise bad_request(
            f"Invalid 'prompt': too long. Expected at most {MAX_PROMPT_ITEMS} prompts and token ids "
            f"in all, but got {items}.",
            param="prompt",
            code="array_above_max_length",
        )
    if all(isinstance(p, str) for p in raw):
        return tuple(raw)
    if all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return (_token_ids(raw, "prompt"),)
    if all(isinstance(p, list) for p in raw):
        return tuple(_token_ids(p, f"prompt[{i}]") for i, p in enumerate(raw))
    raise type_error("prompt", expected, raw)


def _token_ids(raw: list[Json], param: str) -> tuple[int, ...]:
    if not raw:
        raise value_error(param, "a token id array must not be empty.")
    for t in raw:
        if isinstance(t, bool) or not isinstance(t, int):
            raise type_error(param, "an array of integer token ids", raw)
        if t < 0:
            raise value_error(param, f"token ids must be non-negative, got {t}.")
    return tuple(raw)


def check_token_ids(token_ids: tuple[int, ...], vocab_size: int, param: str = "prompt") -> None:
    """Token ids sent by the client must exist in the model's vocabulary."""
    bad = next((t for t in token_ids if t >= vocab_size), None)
    if bad is not None:
        raise value_error(
            param, f"token id {bad} is out of range for a vocabulary of {vocab_size}."
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRequest(GenerationFields):
    model: str
    # One set of n choices per prompt, in order: choice index = prompt index * n + i.
    prompts: tuple[Prompt, ...]
    logprobs: int | None = None
    # Each choice's text starts with its prompt (and, with logprobs, its tokens with the
    # prompt's); with max_tokens 0 that is all it holds: the prompt scored, nothing generated.
    echo: bool = False
    grammar: GrammarSpec | None = None  # response_format, structured_outputs, guided_*

    prompt_param: ClassVar[str] = "prompt"
    logprobs_param: ClassVar[str] = "logprobs"  # the field num_logprobs comes from

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def num_prompt_logprobs(self) -> int | None:
        """What prompt_logprobs shows (never in a stream) and what echo's logprobs list of the
        prompt tokens (streamed too), whichever lists more alternatives."""
        shown = None if self.stream else self.prompt_logprobs
        echoed = self.logprobs if self.echo else None
        wanted = [k for k in (shown, echoed) if k is not None]
        return max(wanted) if wanted else None


def parse_completion_request(body: Body) -> CompletionRequest:
    check_fields(body, "completions")  # a field of neither API, or a value this server cannot honour
    model = required_str(body, "model")
    prompts = _parse_prompts(body)
    # suffix: check_fields refuses any but "" (no model here has fill-in-the-middle tokens).
    echo = bool(opt_bool(body, "echo"))
    if body.get("max_tokens") == 0 and not echo:
        raise value_error(
            "max_tokens", "must be at least 1, got 0 (0 is for echo alone: the prompt, scored)."
        )
    return CompletionRequest(
        model=model,
        prompts=prompts,
        logprobs=opt_int(body, "logprobs", lo=0, hi=MAX_COMPLETION_LOGPROBS),
        echo=echo,
        grammar=parse_grammar(body),
        **parse_generation_fields(body, zero_max_tokens=echo),
    )
