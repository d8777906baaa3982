"""Prompt building: a request's messages or prompts -> the token ids (and media spans) the LLM
runs. Chat renders the model's chat template, then expands each media placeholder through
the model's MediaPipeline; completions encode text prompts or check client token ids.

Templating and tokenizing run in a worker thread, never on the event loop: the tokenizer
releases the GIL while it encodes (encode_batch), and a prompt whose length alone proves it
cannot fit the context is refused before it is tokenized at all (too_long).

Special tokens: in chat, only the template writes them (the client's text is text,
omni/text/chat_encoder.py). A completions prompt is raw, and its special tokens keep their meaning,
as in vLLM, except a media placeholder: with no media behind it, it is a 400 naming `prompt`.

An assistant turn that refers to an earlier spoken answer by its id gets that answer's stored
transcript as its text first (recall_spoken).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeAlias

import msgspec
import orjson

from omni.errors import APIError, bad_request
from omni.modalities.inputs import items as media_items
from omni.modalities.inputs.items import MediaItem, MediaRef
from omni.modalities.inputs.pipeline import PromptInputs
from omni.modalities.inputs.placeholders import placeholder_ids
from omni.serving.model import ServedModel
from omni.serving.requests import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ImageURLPart,
    InputAudioPart,
    TextPart,
    VideoURLPart,
)
from omni.shared.store.base import ArtifactStore, KeyNotFound, StoreError
from omni.shared.store.keys import validate_key
from omni.text.tokenizer import Message, TextTokenizer

MediaPart: TypeAlias = ImageURLPart | InputAudioPart | VideoURLPart


def media_parts(messages: Sequence[ChatMessage]) -> list[tuple[str, MediaPart]]:
    """(param, part) for every non-text part, in message order: the k-th of a kind is the
    k-th item of that kind."""
    return [
        (f"messages[{i}].content[{j}]", part)
        for i, m in enumerate(messages)
        if isinstance(m.content, tuple)
        for j, part in enumerate(m.content)
        if not isinstance(part, TextPart)
    ]


def media_ref(param: str, part: MediaPart) -> MediaRef:
    """OpenAI's content part as the media layer takes it."""
    if isinstance(part, InputAudioPart):
        return MediaRef(param, "audio", data=part.data, fmt=part.format)
    return MediaRef(param, "video" if isinstance(part, VideoURLPart) else "image", url=part.url)


def template_messages(messages: Sequence[ChatMessage], items: Sequence[MediaItem]) -> list[dict[str, Any]]:
    """Messages for the chat template: each media part becomes {"type": kind, "id": ...}
    (transformers' multimodal template convention), an audio or video one with its "duration"
    in seconds (rounded to 0.01 s, as transformers' HyperCLOVAX processor writes it) when its
    container tells it; the template renders placeholders (and the reference's format states
    the duration, docs/REFERENCE_DIALECT.md)."""
    by_param = {item.param: item for item in items}
    counts: dict[str, int] = {}
    out = []
    for i, message in enumerate(messages):
        d = message.to_template_dict()
        if message.has_media and isinstance(message.content, tuple):
            content = []
            for j, part in enumerate(message.content):
                if isinstance(part, TextPart):
                    content.append({"type": "text", "text": part.text})
                    continue
                item = by_param[f"messages[{i}].content[{j}]"]
                n = counts[item.kind] = counts.get(item.kind, 0) + 1
                media: dict[str, Any] = {"type": item.kind, "id": f"{item.kind}_{n - 1}"}
                if item.seconds is not None:
                    media["duration"] = round(item.seconds, 2)
                content.append(media)
            d["content"] = content
        out.append(d)
    return out


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
    return await media_items.load_items([media_ref(p, part) for p, part in parts], model.media.limits)


async def chat_prompt(model: ServedModel, req: ChatCompletionRequest, items: list[MediaItem]) -> PromptInputs:
    """The template's token ids with every media placeholder expanded, and the spans to inject."""
    if not items:  # the messages go to the template as they are
        return PromptInputs(await asyncio.to_thread(_apply_template, model, req, req.messages), ())
    pipeline = model.media
    assert pipeline is not None  # load_media() found none to load items with otherwise
    messages = template_messages(req.messages, items)
    token_ids = await asyncio.to_thread(_apply_template, model, req, messages)
    return await pipeline.expand(token_ids, items, priority=req.priority)


async def completion_prompts(model: ServedModel, req: CompletionRequest) -> list[list[int]]:
    """One token id list per prompt: a string is encoded; client token ids must be in the
    vocabulary. An empty prompt, or one holding a media placeholder, is a 400."""
    return await asyncio.to_thread(_completion_prompts, model, req)


def _completion_prompts(model: ServedModel, req: CompletionRequest) -> list[list[int]]:
    tokenizer = model.tokenizer
    vocab = tokenizer.num_token_ids
    placeholders = placeholder_ids(tokenizer)
    prompts = []
    for i, prompt in enumerate(req.prompts):
        if isinstance(prompt, str):
            _check_length(model, req, prompt, f"prompt {i}")
            ids = tokenizer.encode(prompt)
        else:
            ids = list(prompt)
            if any(t < 0 or t >= vocab for t in ids):
                raise bad_request(f"prompt {i} has token ids outside [0, {vocab})", param="prompt")
        if not ids:
            raise bad_request(f"prompt {i} is empty", param="prompt")
        placeholder = next((t for t in ids if t in placeholders), None)
        if placeholder is not None:
            raise bad_request(
                f"prompt {i} holds the media placeholder {tokenizer.backend.id_to_token(placeholder)} "
                "with no media behind it (completions take no media).",
                param="prompt",
            )
        prompts.append(ids)
    return prompts


def too_long(tokenizer: TextTokenizer, text: str, max_model_len: int) -> int | None:
    """The least number of tokens text can be when that alone exceeds max_model_len, else None.

    The rule (TextTokenizer.max_chars_per_token): one token stands for at most L * F
    characters, so len(text) / (L * F) tokens is a floor; when even the floor leaves no room
    for one generated token, the prompt cannot be served whatever it tokenizes to."""
    floor = tokenizer.min_num_tokens(text)
    return floor if max_model_len > 0 and floor >= max_model_len else None


def _check_length(
    model: ServedModel, req: ChatCompletionRequest | CompletionRequest, text: str, what: str
) -> None:
    if req.truncate_prompt_tokens is not None:  # the client asked to keep its last tokens
        return
    max_model_len = model.pool.max_model_len
    floor = too_long(model.tokenizer, text, max_model_len)
    if floor is not None:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"{what} is {len(text)} characters, at least {floor} tokens, which leaves no room "
            f"for the completion. Please reduce the length of the {req.prompt_param}.",
            param=req.prompt_param,
            code="context_length_exceeded",
        )


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
        text = model.tokenizer.render_prompt(
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
    _check_length(model, req, text, "prompt")
    return model.tokenizer.encode_prompt(text)


async def recall_spoken(store: ArtifactStore | None, req: ChatCompletionRequest) -> ChatCompletionRequest:
    """An assistant turn given as {"audio": {"id": ...}} (an earlier spoken answer of this
    server's, as OpenAI lets a client refer to one) gets its stored transcript as its text; an
    id the store does not have (unknown, or expired and removed) is a 400 naming it. No store
    (an app built without one, in tests) has kept no answers."""
    if not any(m.audio_id for m in req.messages):
        return req
    messages = list(req.messages)
    for i, message in enumerate(messages):
        if message.audio_id is None or message.content is not None:
            continue
        param = f"messages[{i}].audio.id"
        unknown = bad_request(f"No spoken answer has the id '{message.audio_id}' (or it expired).", param=param)
        if store is None:
            raise unknown
        try:
            meta = orjson.loads(await store.get(validate_key(f"out/audio/{message.audio_id}.json")))
        except (KeyNotFound, ValueError, orjson.JSONDecodeError):
            raise unknown from None
        except StoreError:
            raise bad_request(f"The spoken answer '{message.audio_id}' could not be read back.", param=param) from None
        messages[i] = msgspec.structs.replace(message, content=str(meta.get("transcript", "")))
    return msgspec.structs.replace(req, messages=tuple(messages))
