"""POST /v1/chat/completions without HTTP (the response: omni/http/handlers/chat.py; the
Responses API and realtime answer with it too):

    model -> earlier spoken answers -> gates -> media -> prompt -> truncation, sampling, bans
    -> the output kinds the choices may make -> n choices held to their constraints and routed
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from omni.engines.generation import Generation, OutputOptions, choice_params, new_request_id, response_id
from omni.modalities.outputs.audio_chat import ChatAudio
from omni.modalities.outputs.router import OutputRouter
from omni.serving.chat_turns import (
    ban_spans,
    ban_tool_markup,
    chat_outputs,
    check_tool_choice,
    keep_room,
    output_format,
    tool_grammar,
)
from omni.serving.choice_constraints import ChoiceConstraints
from omni.serving.model import ModelRegistry
from omni.serving.prepared import Completion, check_serving, request_grammar
from omni.serving.prompt import chat_prompt, load_media, recall_spoken
from omni.serving.requests import ChatCompletionRequest
from omni.serving.sampling import sampling_params, truncate_prompt, truncated_media
from omni.shared.store.base import ArtifactStore


async def chat(
    models: ModelRegistry,
    req: ChatCompletionRequest,
    *,
    store: ArtifactStore | None,
    timeout: float | None,
    client_request_id: str | None = None,
    previews: asyncio.Queue[Any] | None = None,
    partial_images: int = 0,
    live: bool = False,
) -> Completion:
    """store: where earlier spoken answers are kept, for turns that refer to one by id.
    client_request_id: the client's X-Request-Id; it names the response before the body's
    request_id does, as in vLLM. previews: where partial_images previews of each drawn image
    go, as ImagePreview (the Responses API streams them). live: a Realtime session's turn,
    whose speech the vocoder serves before other speech of its priority."""
    model = models.get(req.model)  # a 404 naming the model if it is not served
    req = await recall_spoken(store, req)  # earlier spoken answers referred to by id
    check_tool_choice(model, req)
    check_serving(model)  # before media: no fetching or encoding for a model that cannot answer
    model.pool.check_admission(req.priority)  # nor for one whose queue is full (429)
    items = await load_media(model, req)
    prompt = await chat_prompt(model, req, items)
    token_ids = truncate_prompt(prompt.token_ids, req, model.pool.max_model_len)
    media = truncated_media(prompt.media, len(prompt.token_ids) - len(token_ids))
    params = sampling_params(
        req,
        max_model_len=model.pool.max_model_len,
        num_prompt_tokens=len(token_ids),
        tokenizer=model.tokenizer,
        max_logprobs=model.pool.config.llm.max_logprobs,
        scheduling_policy=model.pool.config.llm.scheduling_policy,
    )
    params = ban_spans(model, req, ban_tool_markup(model, req, params))
    kinds = chat_outputs(model, req)  # each output kind the choices may make: its spans and its routes
    kinds, params = keep_room(kinds, params)  # a spoken turn's text leaves room for its speech
    if live:
        kinds = [dataclasses.replace(k, live=True) if isinstance(k, ChatAudio) else k for k in kinds]
    if previews is not None and partial_images:
        kinds = [k.with_previews(partial_images, previews) for k in kinds]
    fmt = output_format(model, req, token_ids)
    grammar = (
        await request_grammar(model, req) if req.grammar is not None else await tool_grammar(model, req, params.max_tokens, kinds)
    )
    constraints = ChoiceConstraints(model, req, grammar, token_ids, params.max_tokens, [k.spans() for k in kinds])
    keep_special = model.tokenizer.special_ids(*fmt.markup_tokens)
    completion_id = new_request_id("chatcmpl")
    generations = [
        Generation(
            model.pool,
            model.tokenizer,
            token_ids,
            choice_params(params, i),
            f"{completion_id}-{i}",
            output=OutputOptions(
                req.stop, req.skip_special_tokens, keep_special, req.include_stop_str_in_output, req.stop_token_ids
            ),
            media=media,
            constraint=constraints.new(),
            cache_salt=req.cache_salt,
        )
        for i in range(req.n)
    ]
    outputs = [OutputRouter(g, *(k.route(model, i) for k in kinds)) for i, g in enumerate(generations)]
    return Completion(
        id=response_id("chatcmpl", client_request_id or req.request_id, completion_id), model=model, outputs=outputs, timeout=timeout,
        output_format=fmt, kinds=tuple(kinds), num_media_tokens=prompt.num_media_tokens,
    )  # fmt: skip
