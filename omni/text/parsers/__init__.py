"""Pure text parsers for what a model writes around its answer: tool calls and reasoning.

    generated text -> ReasoningParser (a leading <think> block) -> ToolParser (<tool_call>s)
    -> the message's reasoning_content, content and tool_calls

Each parser works on a whole output (parse) or on its stream (push, then finish), and both give
the same result. tool_grammar writes the grammar that forces a well-formed call, for
tool_choice "required" or a named function. No torch, no server imports: text in, text out.
"""

from omni.text.parsers.reasoning import REASONING_PARSERS, ReasoningParser, reasoning_parser_class
from omni.text.parsers.tool_calls import (
    TOOL_PARSERS,
    HermesToolParser,
    HyperCLOVAXToolParser,
    ToolCall,
    ToolCallDelta,
    ToolFunction,
    ToolParser,
    tool_parser_class,
)
from omni.text.parsers.tool_grammar import MAX_FREE_CHARS, tool_call_grammar

__all__ = [
    "MAX_FREE_CHARS",
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "HermesToolParser",
    "HyperCLOVAXToolParser",
    "ReasoningParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolFunction",
    "ToolParser",
    "reasoning_parser_class",
    "tool_call_grammar",
    "tool_parser_class",
]
