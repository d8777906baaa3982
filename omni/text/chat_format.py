"""ChatFormat: how one model's chat turns are written and read back.

Written: the chat template (the checkpoint's, or --chat-template), and whether a request may
bring its own. Read back: which tool-call parser turns the model's markup into OpenAI
`tool_calls`, and which reasoning parser moves `<think>...</think>` into `reasoning_content`.
Both parsers default to what the checkpoint's template shows: a template that writes
`<arg_key>` inside `<tool_call>` is the reference model's dialect, one that writes JSON inside
`<tool_call>` is Hermes', and a template that mentions `<think>` reasons. The reference's spoken
answers (omni/text/parsers/spoken.py) are read when its vocabulary has their markup or the
template is its prompt format (it writes the `<|..._meta_duration|>` placeholders).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from omni.text.parsers.reasoning import REASONING_PARSERS
from omni.text.parsers.tool_calls import TOOL_PARSERS
from omni.text.tokenizer import TextTokenizer

AUTO = "auto"
NONE = "none"


@dataclass(frozen=True, slots=True)
class ChatFormat:
    tool_parser: str | None = None  # a TOOL_PARSERS name; None: tool calls are not parsed
    reasoning_parser: str | None = None  # a REASONING_PARSERS name; None: reasoning stays content
    auto_tool_choice: bool = True  # tool_choice "auto" is served (vLLM's --enable-auto-tool-choice)
    chat_template: str | None = None  # the server's template, replacing the checkpoint's
    trust_request_chat_template: bool = False  # a request's own chat_template is rendered
    spoken_markup: bool = False  # replies may hold the reference's spoken-answer markup

    @classmethod
    def resolve(
        cls,
        tokenizer: TextTokenizer,
        *,
        tool_parser: str = AUTO,
        reasoning_parser: str = AUTO,
        auto_tool_choice: bool = True,
        chat_template: str | None = None,
        trust_request_chat_template: bool = False,
    ) -> ChatFormat:
        """Fill "auto" from the template the model will render with; "none" turns a parser off."""
        template = chat_template or tokenizer.hf_tokenizer.chat_template or ""
        if not isinstance(template, str):  # a dict of named templates: read them all
            template = "\n".join(str(t) for t in template.values()) if isinstance(template, dict) else ""
        tools = _pick(tool_parser, TOOL_PARSERS, detect_tool_parser(template))
        reasoning = _pick(reasoning_parser, REASONING_PARSERS, detect_reasoning_parser(template))
        return cls(
            tool_parser=tools,
            reasoning_parser=reasoning,
            auto_tool_choice=auto_tool_choice,
            chat_template=chat_template,
            trust_request_chat_template=trust_request_chat_template,
            spoken_markup=detect_spoken_markup(tokenizer, template),
        )


def detect_spoken_markup(tokenizer: TextTokenizer, template: str) -> bool:
    """The reference's dialect: its template (media meta placeholders) over a vocabulary with the
    spoken-answer tags. A vocabulary that merely has the tags, under another template, is read
    as it is: its replies keep their text, whitespace included."""
    return tokenizer.token_to_id("<assistant_transcript>") is not None and "_meta_duration|>" in template


def detect_tool_parser(template: str) -> str | None:
    if "<tool_call>" not in template:
        return None
    return "hyperclovax" if "<arg_key>" in template else "hermes"


def detect_reasoning_parser(template: str) -> str | None:
    return "think" if "<think>" in template else None


def _pick(name: str, known: Mapping[str, object], detected: str | None) -> str | None:
    if name == AUTO:
        return detected
    if name == NONE:
        return None
    if name not in known:
        raise ValueError(f"unknown parser {name!r}; known: {', '.join(sorted(known))}, auto, none")
    return name
