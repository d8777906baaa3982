"""The chat-only steps of the lifecycle: what tools, tool_choice and reasoning ask of the
generation, and how its text is read back.

- check_tool_choice: a tool_choice the server turned off is a 400, before work.
- tool_format: the format the calls are written and read in: the chat template's, or, on a
  model whose template has none, JSON for a forced call (as vLLM serves any model).
- tool_grammar: tool_choice "required" or a named function forces the call grammar, so a call
  whose arguments validate against the function's schema always comes out; with "auto" the
  same grammar switches on when the model opens a call, so a call it starts is well formed.
- ban_tool_markup: tool_choice "none" with tools given: the model cannot open a call.
- output_format: the reasoning and tool-call parsers each choice's text goes through.
- chat_outputs: the output kinds the choices may make, each kind's chat side asked
  (omni/modalities/outputs/chat_output.py); none is named here.
- ban_spans: the span openers of the kinds modalities leaves out are banned.
- keep_room: the text leaves room in max_tokens for what a kind keeps (a spoken turn's speech).
(Each choice's token constraint, its grammar and reasoning budget, is omni/serving/choice_constraints.py.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from omni.errors import bad_request
from omni.modalities.outputs.chat_output import ChatOutput
from omni.modalities.outputs.kinds import CHAT_SIDES
from omni.serving.choice_constraints import TriggeredGrammar, prompt_opens_reasoning
from omni.serving.model import ServedModel
from omni.serving.requests import ChatCompletionRequest
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.parsers.tool_calls import tool_parser_class
from omni.text.parsers.tool_grammar import JSON_ARGUMENTS, JSON_CALLS, MAX_FREE_CHARS, tool_call_grammar
from omni.text.reply_parser import OutputFormat
from scheduler.request import SamplingParams


def check_tool_choice(model: ServedModel, req: ChatCompletionRequest) -> None:
    fmt = model.chat_format
    if req.tools.choice == "auto" and fmt.tool_parser is not None and not fmt.auto_tool_choice:
        raise bad_request(
            'tool_choice "auto" is turned off on this server (--no-enable-auto-tool-choice); '
            'use "none", "required" or a named function.',
            param="tool_choice",
            code="unsupported_parameter",
        )


def tool_format(model: ServedModel, req: ChatCompletionRequest) -> str | None:
    """The format a reply's calls are read in (a tool_calls.py parser's name), None: no calls.
    The chat template's own; on a model whose template has none, a forced call is JSON, as vLLM
    serves it (json_calls for "required", json_arguments for a named function), and "auto"
    leaves the reply plain text."""
    tools, parser = req.tools, model.chat_format.tool_parser
    if tools.choice == "none":
        return None
    if parser is not None:
        return parser
    if tools.choice == "required":
        return JSON_CALLS
    return JSON_ARGUMENTS if tools.choice == "named" else None


async def tool_grammar(
    model: ServedModel, req: ChatCompletionRequest, max_tokens: int, kinds: Sequence[ChatOutput] = ()
) -> TriggeredGrammar | None:
    """The call grammar: from the first token for "required" or a named function; for "auto",
    switched on when the model opens a call, so a call it starts is always well formed. kinds:
    what the choices may make; a tool argument may embed their spans (call_rules)."""
    tools, parser = req.tools, tool_format(model, req)
    if parser is None or not tools.functions:
        return None
    forced = tools.forced
    opened = not forced  # "auto"
    trigger = None
    markup = tool_parser_class(parser).markup_tokens
    if opened:
        trigger = model.tokenizer.token_to_id(markup[0])
        if trigger is None:
            return None  # the tokenizer cannot open a call with one token: parse what comes
    source = tool_call_grammar(
        parser,
        forced or tools.functions,
        parallel=not tools.single_call,
        max_free_chars=free_string_chars(max_tokens),
        opened=opened,
        image_rules=[rule for kind in kinds for rule in kind.call_rules()],
        tokens={m for m in markup if model.tokenizer.token_to_id(m) is not None},
    )
    grammar = await model.grammars.compile(GrammarSpec(GrammarKind.GRAMMAR, source, "tools" if opened else "tool_choice"))
    return TriggeredGrammar(grammar, trigger)  # "auto": from the model's own <tool_call> on


def free_string_chars(max_tokens: int) -> int:
    """The length bound of a forced call's free strings (those with no maxLength, enum or pattern
    of their own): a call must be able to end within the request's budget even when the model
    would not end a string by itself, yet a real answer's long string must not be cut. A quarter
    of max_tokens in characters (a token is at least one), rounded down to a power of two so
    that nearby budgets share one compiled grammar; never under MAX_FREE_CHARS. With the budget
    a whole context leaves, the bound is far beyond any argument a model writes."""
    quarter = max_tokens // 4
    return max(MAX_FREE_CHARS, 1 << (quarter.bit_length() - 1)) if quarter > 0 else MAX_FREE_CHARS


def chat_outputs(model: ServedModel, req: ChatCompletionRequest) -> list[ChatOutput]:
    """Each output kind a chat request's choices may make, in OUTPUT_KINDS' order (each kind's
    chat side asked). Under an answer format, only what it leaves: the content is the format's
    text alone, so no media span is drawn in it or in the reasoning before it (choice_constraints
    holds their openers back), and audio comes only when modalities asks for it, spoken after
    the text."""
    made = [ask(model, req) for ask in CHAT_SIDES]
    if req.grammar is not None:
        made = [k.answer_format() if k is not None else None for k in made]
    return [k for k in made if k is not None]


def keep_room(kinds: list[ChatOutput], params: SamplingParams) -> tuple[list[ChatOutput], SamplingParams]:
    """The turn's text params, less what each kind keeps of max_tokens for itself (a spoken
    turn's speech: so it comes even when the text would run to max_tokens)."""
    out: list[ChatOutput] = []
    for kind in kinds:
        kind, params = kind.within(params)
        out.append(kind)
    return out, params


def ban_spans(model: ServedModel, req: ChatCompletionRequest, params: SamplingParams) -> SamplingParams:
    """modalities leaving out a kind the model makes (an image, audio): the model cannot open
    its span (each kind's ban rule)."""
    banned = tuple((kind.opener(made),) for kind, made in model.kinds if not kind.allowed(req.modalities_sent))
    if not banned:
        return params
    return dataclasses.replace(params, bad_words_token_ids=params.bad_words_token_ids + banned)


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
    reasoning = model.chat_format.reasoning_parser
    tool_parser = tool_format(model, req)
    return OutputFormat(
        reasoning_parser=reasoning,
        in_reasoning=reasoning is not None and prompt_opens_reasoning(model, reasoning, prompt_token_ids),
        tool_parser=tool_parser,
        tools=req.tools.forced if tool_parser == JSON_ARGUMENTS else req.tools.functions,  # (the named one)
        single_call=req.tools.single_call,
        spoken_markup=model.chat_format.spoken_markup,
    )
