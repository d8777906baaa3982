"""Request bodies of the OpenAI API, validated into frozen dataclasses.

Parsing works on already-decoded JSON (read_json reads one from a request). Every
error is a 400 APIError whose param names the offending field, e.g. "messages[1].content".
Fields this server does not know are ignored, as OpenAI clients send many; known fields it
cannot honour (penalties, logit_bias, echo, ...) are rejected rather than silently dropped.

fields.py holds what both endpoints share (and sampling_params); chat.py and completions.py
one endpoint each. This module re-exports what the rest of the server imports.
"""

from omni.api.schemas.chat import (
    ChatCompletionRequest,
    ChatMessage,
    ImageURLPart,
    InputAudioPart,
    TextPart,
    VideoURLPart,
    parse_chat_completion_request,
)
from omni.api.schemas.completions import (
    CompletionRequest,
    check_token_ids,
    parse_completion_request,
)
from omni.api.schemas.fields import read_json, sampling_params

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
    "read_json",
    "sampling_params",
]
