"""The chat-only steps of the lifecycle: what tools, tool_choice and reasoning ask of the
generation, and how its text is read back.

- check_tool_choice: a tool_choice the model's chat format cannot serve is a 400, before work.
- tool_grammar: tool_choice "required" or a named function forces the call grammar, so a call
  whose arguments validate against the function's schema always comes out; with "auto" the
  same grammar switches on when the model opens a call, so a call it starts is well formed.
- ban_tool_markup: tool_choice "none" with tools given: the model cannot open a call.
- output_format: the reasoning and tool-call parsers each choice's text goes through.
- ChatConstraints: each choice's token constraint: its grammar (held off until reasoning ends
  when the prompt leaves the model inside <think>) and its thinking_token_budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from omni.api.errors import bad_request
from omni.api.schemas import ChatCompletionRequest
from omni.chat_output import OutputFormat
from omni.constrained.compiler import CompiledGrammar
from omni.constrained.constraint import ReasoningBudget, TokenConstraint
from omni.constrained.spec import GrammarKind, GrammarSpec
from omni.parsers.reasoning import reasoning_parser_class
from omni.parsers.tool_calls import tool_parser_class
from omni.parsers.tool_grammar import MAX_FREE_CHARS, tool_call_grammar
from omni.served_model import ServedModel
from scheduler.request import SamplingParams

# How far back from the prompt's end an open <think> is looked for (it is followed by at most
# a newline or two).
_PROMPT_TAIL_TOKENS = 4


def check_tool_choice(model: ServedModel, req: ChatCompletionRequest) -> None:
    tools, fmt = req.tools, model.chat_format
    if tools.choice == "none":
        return
    if fmt.tool_parser is None:
        raise bad_request(
            f"tool_choice '{tools.choice if tools.choice != 'named' else tools.named}' needs a tool call "
            "parser, and this model's chat format has none (the server's --tool-call-parser).",
            param="tool_choice",
            code="unsupported_parameter",
        )
    if tools.choice == "auto" and not fmt.auto_tool_choice:
        raise bad_request(
            'tool_choice "auto" is turned off on this server (--no-enable-auto-tool-choice); '
            'use "none", "required" or a named function.',
            param="tool_choice",
            code="unsupported_parameter",
        )


@dataclass(frozen=True, slots=True)
class ToolGrammar:
    grammar: CompiledGrammar
    trigger_token_id: int | None  # "auto": the grammar holds from the model's own <tool_call> on


async def tool_grammar(model: ServedModel, req: ChatCompletionRequest, max_tokens: int) -> ToolGrammar | None:
    """The call grammar: from the first token for "required" or a named function; for "auto",
    switched on when the model opens a call, so a call it starts is always well formed."""
    tools, parser = req.tools, model.chat_format.tool_parser
    if parser is None or tools.choice == "none" or not tools.functions:
        return None
    forced = tools.forced
    opened = not forced  # "auto"
    trigger = None
    if opened:
        trigger = model.tokenizer.token_to_id(tool_parser_class(parser).markup_tokens[0])
        if trigger is None:
            return None  # the tokenizer cannot open a call with one token: parse what comes
    source = tool_call_grammar(
        parser,
        forced or tools.functions,
        parallel=not tools.single_call,
        max_free_chars=free_string_chars(max_tokens),
        opened=opened,
    )
    grammar = await model.grammars.compile(GrammarSpec(GrammarKind.GRAMMAR, source, "tools" if opened else "tool_choice"))
    return ToolGrammar(grammar, trigger)


def free_string_chars(max_tokens: int) -> int:
    """The length bound of a forced call's free strings (those with no maxLength, enum or pattern
    of their own): a call must be able to end within the request's budget even when the model
    would not end a string by itself, yet a real answer's long string must not be cut. A quarter
    of max_tokens in characters (a token is at least one), rounded down to a power of two so
    that nearby budgets share one compiled grammar; never under MAX_FREE_CHARS. With the budget
    a whole context leaves, the bound is far beyond any argument a model writes."""
    quarter = max_tokens // 4
    return max(MAX_FREE_CHARS, 1 << (quarter.bit_length() - 1)) if quarter > 0 else MAX_FREE_CHARS


def ban_tool_markup(model: ServedModel, req: ChatCompletionRequest, params: SamplingParams) -> SamplingParams:
    parser = model.chat_format.tool_parser
    if req.tools.choice != "none" or not req.tools.functions or parser is None:
        return params
    start = tool_parser_class(parser).markup_tokens[0]
    token_id = model.tokenizer.token_to_id(start)
    if token_id is None:
        return params
    banned = params.bad_words_token_ids + ((token_id,),)
    return dataclasses.replace(params, bad_words_token_ids=banned)


def output_format(model: ServedModel, req: ChatCompletionRequest, prompt_token_ids: Sequence[int]) -> OutputFormat:
    fmt = model.chat_format
    reasoning = fmt.reasoning_parser
    tool_parser = fmt.tool_parser if req.tools.choice != "none" else None
    return OutputFormat(
        reasoning_parser=reasoning,
        in_reasoning=reasoning is not None and prompt_opens_reasoning(model, reasoning, prompt_token_ids),
        tool_parser=tool_parser,
        tools=req.tools.functions,
        single_call=req.tools.single_call,
    )


def prompt_opens_reasoning(model: ServedModel, parser: str, prompt_token_ids: Sequence[int]) -> bool:
    """The template ended the prompt inside an open reasoning block (Qwen3 and R1 style)."""
    cls = reasoning_parser_class(parser)
    tail = model.tokenizer.decode(prompt_token_ids[-_PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
    return tail.rstrip().endswith(cls.start)


class ChatConstraints:
    """Makes each choice's TokenConstraint (None when the choice needs none)."""

    def __init__(
        self,
        model: ServedModel,
        req: ChatCompletionRequest,
        grammar: CompiledGrammar | ToolGrammar | None,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
    ) -> None:
        own_trigger = None
        if isinstance(grammar, ToolGrammar):
            own_trigger = grammar.trigger_token_id
            grammar = grammar.grammar
        self._grammar = grammar
        self._max_tokens = max_tokens
        self._vocab_size = model.tokenizer.vocab_size
        self._budget = req.thinking_token_budget
        self._start, self._end = self._reasoning_tokens(model, req)
        parser = model.chat_format.reasoning_parser or "think"
        self._in_reasoning = (grammar is not None or self._budget is not None) and prompt_opens_reasoning(
            model, parser, prompt_token_ids
        )
        # A reasoning model's answer is constrained from the end of its reasoning on; an "auto"
        # tool grammar from the call the model opens.
        self._trigger = own_trigger
        if own_trigger is None and self._in_reasoning and grammar is not None:
            self._trigger = self._end

    @staticmethod
    def _reasoning_tokens(model: ServedModel, req: ChatCompletionRequest) -> tuple[int | None, int | None]:
        parser = model.chat_format.reasoning_parser
        cls = reasoning_parser_class(parser or "think")
        start, end = model.tokenizer.token_to_id(cls.start), model.tokenizer.token_to_id(cls.end)
        if req.thinking_token_budget is not None and (start is None or end is None):
            raise bad_request(
                f"This model has no {cls.start}...{cls.end} tokens to bound its reasoning with.",
                param="thinking_token_budget",
                code="unsupported_parameter",
            )
        return start, end

    def new(self) -> TokenConstraint | None:
        budget = None
        if self._budget is not None:
            assert self._start is not None and self._end is not None
            budget = ReasoningBudget(self._start, self._end, self._budget, open=self._in_reasoning)
        if self._grammar is not None:
            return self._grammar.new_constraint(self._trigger, budget, max_tokens=self._max_tokens)
        if budget is not None:
            return TokenConstraint(None, self._vocab_size, budget=budget)
        return None
