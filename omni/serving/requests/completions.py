"""The body of POST /v1/completions: one or more prompts, as text or token ids. Each field is
declared once (common.py says how); the rules between fields are in check_completion_request."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, TypeAlias

from omni.errors import bad_request
from omni.serving.requests.common import (
    GenerationFields,
    Refused,
    default_only,
    honoured,
    rejected,
)
from omni.serving.requests.fields import Json, type_error, value_error
from omni.serving.requests.structured import grammar_of
from omni.text.constrained.spec import GrammarSpec

MAX_COMPLETION_LOGPROBS = 5
# Token ids (or prompts) in one request, in all: a million-token context's prompt fits, and a
# 60 MB body of 8 million ids is refused before it is copied, checked and freed at length.
MAX_PROMPT_ITEMS = 1 << 20

Prompt: TypeAlias = str | tuple[int, ...]
PROMPT_TYPES = "a string, an array of strings, an array of token ids or an array of token id arrays"


class CompletionRequest(GenerationFields, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # OpenAI's completions fields
    # Any items: which of the four shapes, and each token id, check_completion_request judges.
    prompt: Annotated[
        str | list[Any],
        honoured(
            "text or token ids, one or many prompts",
            # allOf: msgspec writes the union's own anyOf over an anyOf given here
            extra_json_schema={
                "allOf": [
                    {
                        "anyOf": [
                            {"type": "string"},
                            {"type": "array", "minItems": 1, "items": {"type": "string"}},
                            {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                            {
                                "type": "array",
                                "minItems": 1,
                                "items": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                            },
                        ]
                    }
                ]
            },
        ),
    ]
    echo: Annotated[bool, honoured("the completion starts with the prompt")] = False
    logprobs: Annotated[
        int,
        honoured("log probabilities of the sampled token and up to 5 alternatives", ge=0, le=MAX_COMPLETION_LOGPROBS),
    ] | None = None
    # 0 only with echo: the prompt alone, scored
    max_tokens: Annotated[int, honoured("the most tokens to generate; 0 only with echo: the prompt, scored", ge=0)] | None = None
    suffix: Annotated[Refused, default_only("text insertion (fill in the middle) is not supported", "")] = None
    # vLLM's completions fields
    prompt_embeds: Annotated[
        Refused, rejected("prompts as embeddings are not supported; send text or token ids")
    ] = None
    add_special_tokens: Annotated[
        Refused,
        default_only(
            "a text prompt is encoded with the tokenizer's special tokens, e.g. BOS (vLLM's completions default)", True
        ),
    ] = None

    prompt_param: ClassVar[str] = "prompt"
    logprobs_param: ClassVar[str] = "logprobs"  # the field num_logprobs comes from

    @property
    def prompts(self) -> tuple[Prompt, ...]:
        """One set of n choices per prompt, in order: choice index = prompt index * n + i."""
        raw = self.prompt
        if isinstance(raw, str):
            return (raw,)
        if all(isinstance(p, str) for p in raw):
            return tuple(raw)
        if all(isinstance(p, int) for p in raw):
            return (tuple(raw),)
        return tuple(tuple(p) for p in raw)

    @property
    def grammar(self) -> GrammarSpec | None:
        return grammar_of(self)

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


def check_prompt_items(raw: Json) -> None:
    """Before conversion: a prompt of too many token ids is refused unread."""
    if not isinstance(raw, list):
        return
    items = len(raw) + sum(len(p) for p in raw if isinstance(p, list))
    if items > MAX_PROMPT_ITEMS:
        raise bad_request(
            f"Invalid 'prompt': too long. Expected at most {MAX_PROMPT_ITEMS} prompts and token ids "
            f"in all, but got {items}.",
            param="prompt",
            code="array_above_max_length",
        )


def _check_prompt(raw: str | list[Any]) -> None:
    if isinstance(raw, str):
        return
    if not raw:
        raise value_error("prompt", "must not be empty.")
    if all(isinstance(p, str) for p in raw):
        return
    if all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        _check_token_ids(raw, "prompt")
        return
    if all(isinstance(p, list) for p in raw):
        for i, p in enumerate(raw):
            _check_token_ids(p, f"prompt[{i}]")
        return
    raise type_error("prompt", PROMPT_TYPES, raw)


def _check_token_ids(raw: list[Json], param: str) -> None:
    if not raw:
        raise value_error(param, "a token id array must not be empty.")
    for t in raw:
        if isinstance(t, bool) or not isinstance(t, int):
            raise type_error(param, "an array of integer token ids", raw)
        if t < 0:
            raise value_error(param, f"token ids must be non-negative, got {t}.")


def check_token_ids(token_ids: tuple[int, ...], vocab_size: int, param: str = "prompt") -> None:
    """Token ids sent by the client must exist in the model's vocabulary."""
    bad = next((t for t in token_ids if t >= vocab_size), None)
    if bad is not None:
        raise value_error(param, f"token id {bad} is out of range for a vocabulary of {vocab_size}.")


def check_completion_request(req: CompletionRequest) -> None:
    _check_prompt(req.prompt)
    # suffix: check_fields refuses any but "" (no model here has fill-in-the-middle tokens).
    if req.max_tokens == 0 and not req.echo:
        raise value_error("max_tokens", "must be at least 1, got 0 (0 is for echo alone: the prompt, scored).")
    req.grammar  # noqa: B018  (raises on a malformed or second constraint)
