"""GrammarCompiler: one per served model; turns GrammarSpecs into matchers for its tokenizer.

Compiling runs in a thread (a large JSON schema takes milliseconds to seconds), and each spec is
compiled once: the cache keeps a pristine matcher per spec, and every request gets a deep copy
of it, which costs microseconds. A spec the library cannot compile is a 400 that says why.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from typing import Any

import llguidance
import llguidance.hf
from llguidance.gbnf_to_lark import any_to_lark

from omni.errors import APIError, bad_request
from omni.text.constrained.constraint import ReasoningBudget, TokenConstraint
from omni.text.constrained.json_close import JsonCloser
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.tokenizer import TextTokenizer

log = logging.getLogger("omni.text.constrained")

# Whitespace between JSON tokens is not free: a weak model otherwise fills max_tokens with
# it (vLLM's option to disable free whitespace does the same). Compact separators only.
_JSON_DEFAULTS = {"whitespace_flexible": False}


class CompiledGrammar:
    def __init__(
        self,
        spec: GrammarSpec,
        matcher: llguidance.LLMatcher,
        vocab_size: int,
        token_bytes: list[bytes] | None = None,
    ) -> None:
        self.spec = spec
        self._matcher = matcher  # never advanced: the template every request copies
        self._vocab_size = vocab_size
        self._token_bytes = token_bytes  # each id's bytes (byte-level tokenizers), for the closer

    def new_constraint(
        self,
        trigger_token_id: int | None = None,
        budget: ReasoningBudget | None = None,
        *,
        max_tokens: int | None = None,
        spans: bool = False,
    ) -> TokenConstraint:
        """A matcher of its own for one request. max_tokens: the request's budget, which a
        json_object answer is closed within (see json_close.py). spans: the grammar holds each
        span the trigger token opens, not the whole output (image and audio spans)."""
        closer = None
        if self.spec.kind is GrammarKind.JSON_OBJECT and max_tokens is not None and self._token_bytes is not None:
            closer = JsonCloser.for_tokenizer(self._token_bytes, max_tokens)
        return TokenConstraint(self._matcher.deep_copy(), self._vocab_size, trigger_token_id, budget, closer, spans)


class GrammarCompiler:
    def __init__(self, tokenizer: TextTokenizer, *, max_cached: int = 1024) -> None:
        self.tokenizer = tokenizer
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[GrammarSpec, CompiledGrammar] = OrderedDict()
        self._max_cached = max_cached
        self._compiling: dict[GrammarSpec, asyncio.Future[CompiledGrammar]] = {}

    async def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        cached = self._cache.get(spec)
        if cached is not None:
            self._cache.move_to_end(spec)
            return cached
        # Requests asking for the same spec while it compiles share that one compile; other
        # specs compile concurrently with it.
        task = self._compiling.get(spec)
        if task is None:
            task = asyncio.ensure_future(asyncio.to_thread(self._compile, spec))
            self._compiling[spec] = task
            task.add_done_callback(lambda _: self._compiling.pop(spec, None))
        compiled = await asyncio.shield(task)  # one asker leaving does not cancel the others'
        self._cache[spec] = compiled
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        if self._ll_tokenizer is None:  # about a second for a large vocabulary: once per model
            eos = sorted(self.tokenizer.eos_token_ids)
            # Two first compiles may both get here; each conversion is equal, and one is kept.
            self._ll_tokenizer = llguidance.hf.from_tokenizer(
                self.tokenizer.hf_tokenizer,  # type: ignore[arg-type]  # a PreTrainedTokenizerFast
                n_vocab=self.tokenizer.vocab_size,
                eos_token=eos or None,
            )
        grammar = grammar_text(spec)
        matcher = llguidance.LLMatcher(self._ll_tokenizer, grammar)
        if matcher.is_error():
            raise bad_request(
                f"Invalid {_what(spec)} in '{spec.param}': {matcher.get_error()}",
                param=spec.param,
                code="invalid_grammar",
            )
        token_bytes = self.tokenizer.token_bytes(skip_special_tokens=False) if self.tokenizer.is_byte_level else None
        return CompiledGrammar(spec, matcher, self.tokenizer.vocab_size, token_bytes)


def grammar_text(spec: GrammarSpec) -> str:
    """The llguidance grammar for a spec; an APIError when the source is malformed."""
    match spec.kind:
        case GrammarKind.JSON_SCHEMA:
            try:
                schema = json.loads(spec.source)
            except json.JSONDecodeError as e:
                raise _invalid(spec, f"not JSON: {e}") from None
            if isinstance(schema, bool):  # true: any JSON value; false: nothing
                schema = {} if schema else {"not": {}}
            if not isinstance(schema, dict):
                raise _invalid(spec, "a JSON schema is an object")
            return _json_grammar(schema)
        case GrammarKind.JSON_OBJECT:
            return _json_grammar({"type": "object"})
        case GrammarKind.REGEX:
            return str(llguidance.LLMatcher.grammar_from_regex(spec.source))
        case GrammarKind.CHOICE:
            choices = json.loads(spec.source)
            # Lark string literals take JSON's escapes, so each choice is matched literally.
            return "start: " + " | ".join(json.dumps(c) for c in choices)
        case GrammarKind.GRAMMAR:
            try:  # Lark as it is; GBNF / EBNF (llama.cpp's, vLLM's xgrammar's) converted
                lark = any_to_lark(spec.source)
            except Exception as e:  # the converter raises plain exceptions on bad input
                raise _invalid(spec, str(e)) from None
            return str(llguidance.LLMatcher.grammar_from_lark(lark))
    raise AssertionError(spec.kind)


def _json_grammar(schema: dict[str, Any]) -> str:
    return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_DEFAULTS))  # type: ignore[arg-type]


def _what(spec: GrammarSpec) -> str:
    return {
        GrammarKind.JSON_SCHEMA: "JSON schema",
        GrammarKind.JSON_OBJECT: "JSON object format",
        GrammarKind.REGEX: "regular expression",
        GrammarKind.CHOICE: "choice list",
        GrammarKind.GRAMMAR: "grammar",
    }[spec.kind]


def _invalid(spec: GrammarSpec, why: str) -> APIError:
    return bad_request(f"Invalid {_what(spec)} in '{spec.param}': {why}", param=spec.param, code="invalid_grammar")
