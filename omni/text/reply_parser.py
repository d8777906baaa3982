"""Reading a chat reply back: the reasoning, the answer and the tool calls in one choice's text.

The model writes one stream of text; the client gets OpenAI's three channels. The reasoning
parser runs first (it owns the start of the output), and the tool-call parser reads what it
passes on as content. Both work on the whole text (a JSON response) or piece by piece (SSE),
and give the same result either way, which the parsers' tests hold them to.

    text --> ReasoningParser --content--> ToolParser --> [SpokenMarkupParser] --> content, tool_calls
                   '--> reasoning_content

The reference model's dialect adds the last stage: its spoken-answer markup leaves the content
(omni/text/parsers/spoken.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omni.text.parsers.reasoning import ReasoningParser, reasoning_parser_class
from omni.text.parsers.spoken import SpokenMarkupParser
from omni.text.parsers.tool_calls import ToolCall, ToolCallDelta, ToolFunction, ToolParser, tool_parser_class


@dataclass(slots=True)
class ChatDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __iadd__(self, other: ChatDelta) -> ChatDelta:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls += other.tool_calls
        return self


@dataclass(frozen=True, slots=True)
class ChatReply:
    reasoning: str | None  # None: the model did not reason (or no reasoning parser is set)
    content: str
    tool_calls: list[ToolCall]


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """One request's way of reading its choices: made once, a parser per choice from it."""

    reasoning_parser: str | None = None
    in_reasoning: bool = False  # the prompt ends inside an open reasoning block
    tool_parser: str | None = None
    tools: tuple[ToolFunction, ...] = ()
    single_call: bool = False  # parallel_tool_calls false: the first call only
    spoken_markup: bool = False  # the reference's spoken-answer markup is read out of the content

    @property
    def markup_tokens(self) -> tuple[str, ...]:
        """The special tokens the parsers read, which the detokenizer must keep in the text."""
        tokens: tuple[str, ...] = ()
        if self.reasoning_parser is not None:
            tokens += reasoning_parser_class(self.reasoning_parser).markup_tokens
        if self.tool_parser is not None:
            tokens += tool_parser_class(self.tool_parser).markup_tokens
        if self.spoken_markup:
            tokens += SpokenMarkupParser.markup_tokens
        return tokens

    def new_parser(self) -> ChoiceParser:
        reasoning = None
        if self.reasoning_parser is not None:
            reasoning = reasoning_parser_class(self.reasoning_parser)(in_reasoning=self.in_reasoning)
        tools = None
        if self.tool_parser is not None:
            tools = tool_parser_class(self.tool_parser)(self.tools)
        spoken = SpokenMarkupParser() if self.spoken_markup else None
        return ChoiceParser(reasoning, tools, self.single_call, spoken)


class ChoiceParser:
    def __init__(
        self,
        reasoning: ReasoningParser | None,
        tools: ToolParser | None,
        single_call: bool,
        spoken: SpokenMarkupParser | None = None,
    ) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self._single_call = single_call
        self._spoken = spoken
        self.made_calls = False  # a tool call came out (finish_reason becomes "tool_calls")

    def parse(self, text: str, *, cut: bool = False, spoke: bool = False) -> ChatReply:
        """The whole output at once; cut: it ended at the length limit (a call it cut is a call);
        spoke: audio came out of it."""
        reasoning, content = (None, text) if self._reasoning is None else self._reasoning.parse(text)
        calls: list[ToolCall] = []
        if self._tools is not None:
            content, calls = self._tools.parse(content, cut=cut)
            if self._single_call:
                calls = calls[:1]
        if self._spoken is not None:
            content = self._spoken.parse(content, spoke=spoke)
        self.made_calls = bool(calls)
        return ChatReply(reasoning, content, calls)

    def push(self, text: str) -> ChatDelta:
        """The next piece of a streamed output."""
        if self._reasoning is None:
            return self._content(text, final=False)
        reasoning, content = self._reasoning.push(text)
        delta = self._content(content, final=False)
        delta.reasoning = reasoning
        return delta

    def finish(self, *, cut: bool = False, spoke: bool = False) -> ChatDelta:
        """The output ended (cut: at the length limit; spoke: audio came out of it): everything
        the parsers still held back."""
        if self._reasoning is None:
            return self._content("", final=True, cut=cut, spoke=spoke)
        reasoning, content = self._reasoning.finish()
        delta = self._content(content, final=True, cut=cut, spoke=spoke)
        delta.reasoning = reasoning
        return delta

    def _content(self, text: str, *, final: bool, cut: bool = False, spoke: bool = False) -> ChatDelta:
        delta = self._calls(text, final=final, cut=cut)
        if self._spoken is not None:
            delta.content = self._spoken.push(delta.content)
            if final:
                delta.content += self._spoken.finish(spoke=spoke)
        return delta

    def _calls(self, text: str, *, final: bool, cut: bool) -> ChatDelta:
        if self._tools is None:
            return ChatDelta(content=text)
        content, calls = self._tools.push(text) if text else ("", [])
        if final:
            more_content, more_calls = self._tools.finish(cut=cut)
            content, calls = content + more_content, calls + more_calls
        if self._single_call:
            calls = [c for c in calls if c.index == 0]
        if calls:
            self.made_calls = True
        return ChatDelta(content=content, tool_calls=calls)
