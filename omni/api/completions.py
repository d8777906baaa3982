"""POST /v1/completions (legacy text completions: one or more prompts, n choices each)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from omni.api import sse
from omni.api.errors import bad_request, service_unavailable
from omni.api.logprobs import completion_logprobs
from omni.api.schemas import (
    CompletionRequest,
    parse_completion_request,
    read_json,
    sampling_params,
)
from omni.generation import Delta, Generation, Usage, choice_params, new_request_id
from omni.served_model import ServedModel
from omni.state import MODELS


def _prompt_token_ids(model: ServedModel, req: CompletionRequest) -> list[list[int]]:
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


async def create_completion(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    req = parse_completion_request(body)
    model = request.app[MODELS].get(req.model)
    prompts = _prompt_token_ids(model, req)
    if not model.pool.serving:
        raise service_unavailable("The model is starting; retry shortly.", retry_after_s=5)
    completion_id = new_request_id("cmpl")
    generations = []
    for p, ids in enumerate(prompts):
        params = sampling_params(
            req, max_model_len=model.pool.max_model_len, num_prompt_tokens=len(ids)
        )
        for i in range(req.n):
            index = p * req.n + i
            generations.append(
                Generation(
                    model,
                    ids,
                    choice_params(params, i),
                    req.stop,
                    f"{completion_id}-{index}",
                    req.skip_special_tokens,
                )
            )
    if req.stream:
        return await _stream(request, req, model, completion_id, generations)
    return await _complete(req, model, completion_id, generations)


def _usage(generations: list[Generation], n: int) -> Usage:
    usage = Usage()
    for index, g in enumerate(generations):
        usage.completion_tokens += g.usage.completion_tokens
        if index % n == 0:  # each prompt counted once, as OpenAI does
            usage.prompt_tokens += g.usage.prompt_tokens
            usage.cached_tokens += g.usage.cached_tokens
    return usage


async def _complete(
    req: CompletionRequest, model: ServedModel, completion_id: str, generations: list[Generation]
) -> web.Response:
    collected = await sse.collect(generations)
    choices = [
        {
            "index": i,
            "text": c.text,
            "logprobs": (
                completion_logprobs(model.tokenizer, c.logprobs, 0)
                if req.logprobs is not None
                else None
            ),
            "finish_reason": c.finish_reason,
        }
        for i, c in enumerate(collected)
    ]
    body = sse.completion_body(completion_id, "text_completion", model.name, choices)
    return web.json_response(body | {"usage": _usage(generations, req.n).to_json()})


async def _stream(
    request: web.Request,
    req: CompletionRequest,
    model: ServedModel,
    completion_id: str,
    generations: list[Generation],
) -> web.StreamResponse:
    response = await sse.open_event_stream(request)
    stream = sse.ChunkStream(response, completion_id, "text_completion", model.name, req.include_usage)
    offsets = [0] * len(generations)  # characters of each choice sent so far (logprob offsets)

    def choice(index: int, delta: Delta) -> dict[str, Any] | None:
        if not delta.text and delta.finish_reason is None and req.logprobs is None:
            return None
        lp = None
        if req.logprobs is not None:
            lp = completion_logprobs(model.tokenizer, delta.logprobs, offsets[index])
        offsets[index] += len(delta.text)
        return {"index": index, "text": delta.text, "logprobs": lp, "finish_reason": delta.finish_reason}

    await stream.run(generations, choice, lambda: _usage(generations, req.n))
    return response
