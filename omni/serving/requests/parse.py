"""The generation endpoints' bodies -> their request Structs: the dispositions first (a field
of neither API, or a value this server cannot honour), then the Struct (types and bounds, in
C), then the rules between fields."""

from __future__ import annotations

from omni.serving.requests.chat import ChatCompletionRequest, check_chat_request, check_item_count
from omni.serving.requests.common import check_generation
from omni.serving.requests.completions import CompletionRequest, check_completion_request, check_prompt_items
from omni.serving.requests.dispositions import check_fields
from omni.serving.requests.fields import Body, convert


def parse_chat_completion_request(body: Body) -> ChatCompletionRequest:
    check_fields(body, "chat")
    check_item_count(body.get("messages"))
    req = convert(body, ChatCompletionRequest, within=("image",))
    check_generation(req)
    check_chat_request(req)
    return req


def parse_completion_request(body: Body) -> CompletionRequest:
    check_fields(body, "completions")
    check_prompt_items(body.get("prompt"))
    req = convert(body, CompletionRequest)
    check_completion_request(req)
    check_generation(req)
    return req
