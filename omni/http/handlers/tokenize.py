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
from omni.http.sse import json_response
from omni.http.state import MODELS
from omni.serving.bodies import DetokenizeResponse, TokenizeResponse
from omni.serving.model import ServedModel
from omni.serving.prompt import chat_prompt, media_parts
from omni.serving.requests import parse_chat_completion_request
from omni.serving.requests.fields import missing
from omni.serving.requests.tokenize import (
    DETOKENIZE_PATH,
    TOKENIZE_PATH,
    TokenizeChatRequest,
    parse_detokenize_request,
    parse_tokenize_request,
)

__all__ = ["DETOKENIZE_PATH", "TOKENIZE_PATH", "detokenize", "tokenize"]


async def tokenize(request: web.Request) -> web.Response:
    req = parse_tokenize_request(await read_json(request))
    model = _model(request, req.model)
    if isinstance(req, TokenizeChatRequest):
        token_ids = await _chat_tokens(model, req)
    else:
        token_ids = await asyncio.to_thread(
            model.tokenizer.encode, req.prompt, add_special_tokens=req.add_special_tokens
        )
    out = TokenizeResponse(
        count=len(token_ids),
        max_model_len=model.pool.max_model_len or None,  # 0 until the worker reports it
        tokens=token_ids,
        token_strs=_token_strs(model, token_ids) if req.return_token_strs else None,
    )
    return await json_response(out)


async def detokenize(request: web.Request) -> web.Response:
    req = parse_detokenize_request(await read_json(request))
    model = _model(request, req.model)
    tokens = req.tokens
    vocab = model.tokenizer.num_token_ids
    outside = next((t for t in tokens if not 0 <= t < vocab), None)
    if outside is not None:
        raise bad_request(f"Token id {outside} is outside the vocabulary [0, {vocab}).", param="tokens", code="invalid_value")
    # Special tokens are kept, as vLLM's detokenize keeps them.
    text = await asyncio.to_thread(model.tokenizer.decode, tokens, skip_special_tokens=False)
    return await json_response(DetokenizeResponse(text))


def _model(request: web.Request, name: str | None) -> ServedModel:
    """The named model (a 404 naming it when not served), or the only one served."""
    registry = request.app[MODELS]
    if name is not None:
        return registry.get(name)
    if len(registry) != 1:
        raise missing("model")  # several models (or none): the client must name one
    return next(iter(registry))


async def _chat_tokens(model: ServedModel, tokenize: TokenizeChatRequest) -> list[int]:
    # In a worker thread: parsing is Python over every message (seconds for a body of many).
    req = await asyncio.to_thread(parse_chat_completion_request, tokenize.chat_body(model.name))
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
