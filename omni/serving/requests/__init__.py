"""Request bodies of the OpenAI API, converted into frozen msgspec Structs.

Parsing works on already-decoded JSON (read_json reads one from a request). Every
error is a 400 APIError whose param names the offending field, e.g. "messages[1].content".
Nothing is silently ignored: every field of OpenAI's and vLLM's APIs is honoured or a 400
naming it, and a field of neither API is a 400 too (dispositions.py has the inventory, with
the reason for each field this server refuses).

fields.py holds what both endpoints share; chat.py and completions.py
one endpoint each; tools.py and structured.py the tool and output-constraint fields. This module re-exports what the rest of the server imports.
"""

from omni.serving.requests.chat import (
    ChatCompletionRequest,
    ChatMessage,
    ImageURLPart,
    InputAudioPart,
    TextPart,
    VideoURLPart,
)
from omni.serving.requests.completions import (
    CompletionRequest,
    check_token_ids,
)
from omni.serving.requests.parse import parse_chat_completion_request, parse_completion_request

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ImageURLPart",
    "InputAudioPart",
    "TextPart",
    "VideoURLPart",
    "check_token_ids",
    "parse_chat_completion_request",
    "parse_completion_request",
]
