"""POST /tokenize and POST /detokenize: vLLM's tokenizer endpoints.

/tokenize takes vLLM's TokenizeCompletionRequest (a text `prompt`) or TokenizeChatRequest
(`messages`, rendered by the chat completion's own path: parse_chat_completion_request, then
omni/serving/prompt.py's chat_prompt, so the count is the prompt_tokens a chat completion of the same
messages reports). /detokenize decodes token ids back to text. Neither needs a worker: they
answer while a model is starting. Tokenizing runs off the event loop, as prompt.py explains.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiohttp import web

from omni.errors import bad_request
from omni.http.body import read_json
from omni.serving.requests import parse_chat_completion_request
from omni.serving.requests.fields import Body, missing, opt_bool, opt_str, type_error
from omni.serving.prompt import chat_prompt, media_parts
from omni.serving.model import ServedModel
from omni.serving.responses import DetokenizeResponse, TokenizeResponse
from omni.http.sse import json_response
from omni.http.state import MODELS

TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"

PROMPT_FIELDS = frozenset({"model", "prompt", "add_special_tokens", "return_token_strs"})
# The chat fields that shape the rendered prompt: passed to the chat completion parser as they are.
TEMPLATE_FIELDS = (
    "messages", "tools", "chat_template", "chat_template_kwargs",
    "add_generation_prompt", "continue_final_message", "documents",
)  # fmt: skip
CHAT_FIELDS = frozenset({"model", "add_special_tokens", "return_token_strs", *TEMPLATE_FIELDS})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


async def tokenize(request: web.Request) -> web.Response:
    body = await read_json(request)
    model = _model(request, body)
    if "messages" in body and "prompt" in body:
        raise bad_request("Give either 'prompt' or 'messages', not both.", param="prompt")
    chat = "messages" in body
    _check_fields(body, CHAT_FIELDS if chat else PROMPT_FIELDS, TOKENIZE_PATH)
    return_strs = bool(opt_bool(body, "return_token_strs"))
    if chat:
        token_ids = await _chat_tokens(model, body)
    else:
        prompt = opt_str(body, "prompt")
        if prompt is None:
            raise missing("prompt")  # or messages: the chat form
        add_special = opt_bool(body, "add_special_tokens") is not False  # vLLM's default: true
        token_ids = await asyncio.to_thread(model.tokenizer.encode, prompt, add_special_tokens=add_special)
    out = TokenizeResponse(
        count=len(token_ids),
        max_model_len=model.pool.max_model_len or None,  # 0 until the worker reports it
        tokens=token_ids,
        token_strs=_token_strs(model, token_ids) if return_strs else None,
    )
    return await json_response(out)


async def detokenize(request: web.Request) -> web.Response:
    body = await read_json(request)
    model = _model(request, body)
    _check_fields(body, DETOKENIZE_FIELDS, DETOKENIZE_PATH)
    tokens = body.get("tokens")
    if tokens is None:
        raise missing("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise type_error("tokens", "an array of integers", tokens)
    vocab = model.tokenizer.vocab_size
    outside = next((t for t in tokens if not 0 <= t < vocab), None)
    if outside is not None:
        raise bad_request(f"Token id {outside} is outside the vocabulary [0, {vocab}).", param="tokens", code="invalid_value")
    # Special tokens are kept, as vLLM's detokenize keeps them.
    text = await asyncio.to_thread(model.tokenizer.decode, tokens, skip_special_tokens=False)
    return await json_response(DetokenizeResponse(text))


def _model(request: web.Request, body: Body) -> ServedModel:
    """The named model (a 404 naming it when not served), or the only one served."""
    registry = request.app[MODELS]
    name = opt_str(body, "model")
    if name is not None:
        return registry.get(name)
    if len(registry) != 1:
        raise missing("model")  # several models (or none): the client must name one
    return next(iter(registry))


def _check_fields(body: Body, known: frozenset[str], path: str) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad_request(
            f"Unrecognized request argument supplied: '{unknown[0]}' is not a field of {path} "
            f"(fields: {', '.join(sorted(known))}).",
            param=unknown[0],
            code="unknown_parameter",
        )


async def _chat_tokens(model: ServedModel, body: Body) -> list[int]:
    if opt_bool(body, "add_special_tokens"):
        # The template writes the special tokens a chat prompt has; adding a BOS on top of it
        # would count a prompt no chat completion runs.
        raise bad_request(
            "'add_special_tokens' true is not supported with 'messages': the chat template writes them.",
            param="add_special_tokens",
            code="unsupported_parameter",
        )
    chat = {key: body[key] for key in TEMPLATE_FIELDS if key in body}
    # In a worker thread: parsing is Python over every message (seconds for a body of many).
    req = await asyncio.to_thread(parse_chat_completion_request, {"model": model.name, **chat})
    parts = media_parts(req.messages)
    if parts:  # refused before any fetching: counting them needs the encoder's placeholders
        param, part = parts[0]
        raise bad_request(
            f"/tokenize does not count {part.type} parts yet; send the text parts alone.",
            param=param,
            code="unsupported_content_type",
        )
    prompt = await chat_prompt(model, req, [])
    return list(prompt.token_ids)


def _token_strs(model: ServedModel, token_ids: Sequence[int]) -> list[str | None]:
    return [model.tokenizer.backend.id_to_token(t) for t in token_ids]
