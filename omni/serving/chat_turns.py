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
- chat_images: whether and how the images a model draws come out (seeded per
  choice: choice i's first image has seed + i * SEEDS_PER_CHOICE, its next ones count up).
- ban_spans: the span openers of the kinds modalities leaves out are banned.
- leave_room_for_speech: a spoken turn's text leaves room in max_tokens for its speech.
(Each choice's token constraint, its grammar and reasoning budget, is omni/serving/choice_constraints.py.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from omni.errors import bad_request
from omni.modalities.outputs.image import IMAGE, ImageRoute, ImageSettings, ModelImages, SizedPreviewCallback
from omni.modalities.outputs.kind import OutputSpans
from omni.modalities.outputs.router import SpanRoute
from omni.serving.choice_constraints import TriggeredGrammar, prompt_opens_reasoning
from omni.serving.model import ServedModel
from omni.serving.requests import ChatCompletionRequest
from omni.serving.requests.images import ChatImageOptions
from omni.serving.spoken import ChatAudio, chat_audio
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.parsers.tool_calls import tool_parser_class
from omni.text.parsers.tool_grammar import JSON_ARGUMENTS, JSON_CALLS, MAX_FREE_CHARS, T2I_TOOL, tool_call_grammar
from omni.text.reply_parser import OutputFormat
from scheduler.request import SamplingParams

SEEDS_PER_CHOICE = 1 << 16  # more images than one turn holds


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


async def tool_grammar(model: ServedModel, req: ChatCompletionRequest, max_tokens: int) -> TriggeredGrammar | None:
    """The call grammar: from the first token for "required" or a named function; for "auto",
    switched on when the model opens a call, so a call it starts is always well formed."""
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
    images = model.output(IMAGE) if req.images_allowed else None
    source = tool_call_grammar(
        parser,
        forced or tools.functions,
        parallel=not tools.single_call,
        max_free_chars=free_string_chars(max_tokens),
        opened=opened,
        image_rules=images.format.rules("image") if images is not None else (),
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


@dataclass(frozen=True, slots=True)
class ChatImages:
    """How a chat request's choices draw the images their model opens spans for."""

    images: ModelImages
    settings: ImageSettings
    inline: bool  # the reference dialect: the image is a t2i_model_generation call's argument
    on_preview: Callable[[int], SizedPreviewCallback] | None = None  # choice index -> its previews' callback

    def spans(self) -> OutputSpans | None:
        grammar = self.images.grammar
        return None if grammar is None else OutputSpans(grammar, self.images.format.start_token_id)

    def answer_format(self) -> ChatImages | None:
        """Under an answer format (response_format, structured outputs) the content is the
        format's text alone: nothing is drawn."""
        return None

    def with_previews(self, partial_images: int, on_preview: Callable[[int], SizedPreviewCallback]) -> ChatImages:
        """Each drawn image's partial_images previews go to on_preview(choice index)."""
        settings = dataclasses.replace(self.settings, partial_images=partial_images)
        return dataclasses.replace(self, settings=settings, on_preview=on_preview)

    def route(self, model: ServedModel, choice_index: int) -> ImageRoute:
        seed = self.settings.seed
        first = None if seed is None else seed + choice_index * SEEDS_PER_CHOICE
        on_preview = None if self.on_preview is None else self.on_preview(choice_index)
        return self.images.route(self.settings, first_seed=first, inline=self.inline, on_preview=on_preview)


class ChatOutput(Protocol):
    """One output kind as a chat request gets it (ChatImages here, ChatAudio in spoken.py): the
    spans its choices are held to, and each choice's route."""

    def spans(self) -> OutputSpans | None: ...

    def answer_format(self) -> ChatOutput | None:
        """What is left of it under an answer format (None: nothing)."""
        ...

    def route(self, model: ServedModel, choice_index: int) -> SpanRoute: ...


def chat_outputs(model: ServedModel, req: ChatCompletionRequest) -> list[ChatOutput]:
    """Each output kind a chat request's choices may make, in OUTPUT_KINDS' order. Under an
    answer format, only what it leaves: the content is the format's text alone, so no media
    span is drawn in it or in the reasoning before it (choice_constraints holds their openers
    back), and audio comes only when modalities asks for it, spoken after the text."""
    made: list[ChatOutput | None] = [chat_images(model, req), chat_audio(model, req)]
    if req.grammar is not None:
        made = [k.answer_format() if k is not None else None for k in made]
    return [k for k in made if k is not None]


def leave_room_for_speech(kinds: list[ChatOutput], params: SamplingParams) -> tuple[list[ChatOutput], SamplingParams]:
    """A turn that asks for audio: its text's params keep room in max_tokens for the speech
    (ChatAudio.within), so the speech comes even when the text would run to max_tokens."""
    out: list[ChatOutput] = []
    for kind in kinds:
        if isinstance(kind, ChatAudio):
            kind, params = kind.within(params)
        out.append(kind)
    return out, params


def chat_images(model: ServedModel, req: ChatCompletionRequest) -> ChatImages | None:
    """None when no image can come out: the model has no vision decoder (then asking for images
    is a 400), or modalities leaves image out."""
    images = model.output(IMAGE)
    if images is None:  # (`image` alone is accepted: it says how images are drawn, if any are)
        if "image" in req.modalities:
            raise bad_request("This model has no image decoder: it cannot produce images.", param="modalities")
        return None
    if not req.images_allowed:
        return None
    opts = req.image or ChatImageOptions()
    settings = ImageSettings(
        size=opts.size,
        steps=opts.num_inference_steps,
        guidance_scale=opts.guidance_scale,
        seed=req.seed,
        output_format=opts.output_format,
        quality=opts.output_compression,
        as_url=opts.response_format == "url",
    )
    tools = req.tools
    inline = (
        model.chat_format.tool_parser == "hyperclovax"
        and tools.choice != "none"
        and any(f.name == T2I_TOOL for f in tools.functions)
    )
    return ChatImages(images, settings, inline)


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
