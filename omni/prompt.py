"""Prompt building: a request's messages or prompts -> the token ids (and media spans) the LLM
runs. Chat renders the model's chat template, then expands each media placeholder through
the model's MediaPipeline; completions encode text prompts or check client token ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from omni.api.errors import bad_request
from omni.api.schemas import ChatCompletionRequest, CompletionRequest
from omni.media_input.items import MediaItem, media_parts
from omni.media_input.pipeline import PromptInputs
from omni.served_model import ServedModel
from omni.tokenizer import Message


async def load_media(model: ServedModel, req: ChatCompletionRequest) -> list[MediaItem]:
    """The request's media parts loaded to bytes (none for a text-only request)."""
    parts = media_parts(req.messages)
    if not parts:
        return []
    if model.media is None:  # a text-only model (no encoder components) names the part it refuses
        param, part = parts[0]
        raise bad_request(
            f"This model does not accept {part.type} input.", param=param, code="unsupported_content_type"
        )
    return await model.media.load_items(req.messages)


async def chat_prompt(model: ServedModel, req: ChatCompletionRequest, items: list[MediaItem]) -> PromptInputs:
    """The template's token ids with every media placeholder expanded, and the spans to inject."""
    if not items:  # the messages go to the template as they are
        return PromptInputs(_apply_template(model, req, req.messages), ())
    pipeline = model.media
    assert pipeline is not None  # load_media() found none to load items with otherwise
    token_ids = _apply_template(model, req, pipeline.template_messages(req.messages, items))
    return await pipeline.expand(token_ids, items)


def completion_prompts(model: ServedModel, req: CompletionRequest) -> list[list[int]]:
    """One token id list per prompt: a string is encoded; client token ids must be in the
    vocabulary. An empty prompt is a 400."""
    vocab = model.tokenizer.vocab_size
    prompts = []
    for i, prompt in enumerate(req.prompts):
        if isinstance(prompt, str):
            ids = model.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
            if any(t < 0 or t >= vocab for t in ids):
                raise bad_request(f"prompt {i} has token ids outside [0, {vocab})", param="prompt")
        if not ids:
            raise bad_request(f"prompt {i} is empty", param="prompt")
        prompts.append(ids)
    return prompts


def _apply_template(model: ServedModel, req: ChatCompletionRequest, messages: Sequence[Message]) -> list[int]:
    fields, fmt = req.template, model.chat_format
    if fields.chat_template is not None and not fmt.trust_request_chat_template:
        raise bad_request(
            "This server does not render a request's own chat template "
            "(it is started with --trust-request-chat-template to allow it).",
            param="chat_template",
            code="unsupported_parameter",
        )
    try:
        return model.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=fields.add_generation_prompt,
            continue_final_message=fields.continue_final_message,
            tools=req.tools.template_tools or None,
            documents=[dict(d) for d in fields.documents] or None,
            chat_template=fields.chat_template or fmt.chat_template,
            **fields.kwargs,
        )
    except ValueError as exc:
        param = "chat_template" if fields.chat_template is not None else "messages"
        raise bad_request(f"Could not render the chat template: {exc}", param=param) from None
