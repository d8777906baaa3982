"""POST /v1/chat/completions: the handler, and the chat response format. The lifecycle itself
is omni.serving.chat.chat. What an output kind adds to a message or a chunk (content parts after
the text, a field of its own) is its chat side's ChatBody (omni/modalities/outputs/chat_output.py):
this loops over the request's kinds and names none."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from omni.engines.generation import Delta, TokenLogprob, Usage
from omni.http import sse
from omni.http.access_log import client_request_id, note_generation
from omni.http.body import body_timeout, read_parsed, request_timeout
from omni.http.logprobs import chat_logprob_entries, prompt_logprobs_json
from omni.http.state import MODELS, STORE
from omni.modalities.outputs.chat_output import ChatBody
from omni.modalities.outputs.router import OutputRouter
from omni.serving import chat as lifecycle
from omni.serving.bodies import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatLogprobs,
    ChunkDelta,
    ChunkUsage,
    FinishReason,
    FunctionDelta,
    OutputFunction,
    OutputToolCall,
    ToolCallDelta,
    finish_reason,
    usage_body,
)
from omni.serving.bodies import Usage as UsageBody
from omni.serving.prepared import Completion
from omni.serving.requests import ChatCompletionRequest, parse_chat_completion_request
from omni.serving.requests.chat import TextPart
from omni.text.parsers.tool_calls import ToolCallDelta as ParsedToolCallDelta
from omni.text.tokenizer import TextTokenizer


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    req = await read_parsed(request, parse_chat_completion_request, timeout=body_timeout(request))
    # An app built without create_app (tests) may have no store: it kept no spoken answers.
    store = request.app.get(STORE)
    completion = await lifecycle.chat(
        request.app[MODELS], req, store=store, timeout=request_timeout(request),
        client_request_id=client_request_id(request),
    )  # fmt: skip
    note_generation(request, completion.model.name, completion.generations)
    with completion.admitted():  # or a 429, before any streaming
        return await respond(request, req, completion)


async def respond(
    request: web.Request, req: ChatCompletionRequest, completion: Completion
) -> web.StreamResponse:
    if req.stream:
        return await _stream(request, req, completion)
    return await _complete(request, req, completion)


async def _complete(request: web.Request, req: ChatCompletionRequest, completion: Completion) -> web.Response:
    tokenizer = completion.model.tokenizer
    fmt = completion.output_format
    collected = await sse.collect(completion.outputs)
    echo = _echo(req)
    bodies = [k.body(len(collected)) for k in completion.kinds]
    choices = []
    for i, c in enumerate(collected):
        parser = fmt.new_parser()
        reply = parser.parse(c.text, cut=c.finish_reason == "length", spoke=any(b.spoke(i, c) for b in bodies))
        message = ChatCompletionMessage(role="assistant", content=echo + reply.content)
        for b in bodies:
            b.count(c)
        parts = [part for b in bodies for part in b.parts(c)]
        if parts:
            message.content = _content_parts(echo + reply.content, parts)
        if reply.tool_calls:
            message.tool_calls = [
                OutputToolCall(t.id, "function", OutputFunction(t.name, t.arguments)) for t in reply.tool_calls
            ]
            if not message.content:
                message.content = None  # as OpenAI answers a turn that only calls tools
        if fmt.reasoning_parser is not None:
            message.reasoning_content = message.reasoning = reply.reasoning
        for b in bodies:  # a spoken turn: message.audio, its text the transcript and no content
            for name, value in (await b.message(c, reply.content or "")).items():
                setattr(message, name, value)
        logprobs = _logprobs(req, tokenizer, c.logprobs)
        choices.append(ChatChoice(i, message, logprobs, _finish_reason(c.finish_reason, parser.made_calls), c.stop_reason))
    body = ChatCompletion(
        id=completion.id,
        object="chat.completion",
        created=int(time.time()),
        model=completion.model.name,
        choices=choices,
        usage=_usage_body(completion.outputs, bodies),
    )
    num_items = sum(len(c.logprobs) for c in collected)
    if req.num_prompt_logprobs is not None:  # vLLM's place for them: the top level, one prompt for all choices
        prompt = completion.outputs[0].generation.prompt_logprobs
        assert prompt is not None  # complete once the first delta is out, and collect() ran them all
        body.prompt_logprobs = prompt_logprobs_json(tokenizer, prompt, req.prompt_logprobs)
        num_items += len(body.prompt_logprobs)
    return await sse.json_response(body, num_items=num_items)


def _logprobs(
    req: ChatCompletionRequest, tokenizer: TextTokenizer, logprobs: list[TokenLogprob]
) -> ChatLogprobs | None:
    if not req.logprobs:
        return None
    return ChatLogprobs(chat_logprob_entries(tokenizer, logprobs, as_token_ids=req.return_tokens_as_token_ids))


def _finish_reason(reason: str | None, made_calls: bool) -> FinishReason:
    # A reply that called tools ends for that reason, as OpenAI's do.
    return "tool_calls" if made_calls and reason == "stop" else finish_reason(reason)


def _echo(req: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the reply starts with the last message when it is the assistant's
    own (continue_final_message), so the client gets the whole turn back."""
    last = req.messages[-1]
    if not req.echo or last.role != "assistant" or req.template.add_generation_prompt:
        return ""
    return last.text


async def _stream(
    request: web.Request, req: ChatCompletionRequest, completion: Completion
) -> web.StreamResponse:
    tokenizer = completion.model.tokenizer
    fmt = completion.output_format
    response = await sse.open_event_stream(request)
    created, name = int(time.time()), completion.model.name

    def chunk(choices: list[ChatChunkChoice], usage: ChunkUsage) -> ChatCompletionChunk:
        return ChatCompletionChunk(completion.id, "chat.completion.chunk", created, name, choices, usage)

    stream = sse.ChunkStream(response, chunk, req.include_usage, req.continuous_usage)
    echo = _echo(req)
    for i, output in enumerate(completion.outputs):  # the role comes first, in a chunk of its own
        role = ChunkDelta(role="assistant", content=echo)
        await stream.send([ChatChunkChoice(i, role, None, None)], stream.chunk_usage(output))
    parsers = [fmt.new_parser() for _ in completion.outputs]
    bodies = [k.body(len(completion.outputs)) for k in completion.kinds]
    parts: list[tuple[int, list[Any]]] = []  # content parts made on the delta choice() just read

    def choice(index: int, delta: Delta) -> ChatChunkChoice | None:
        parser = parsers[index]
        parsed = parser.push(delta.text)
        if delta.finish_reason is not None:
            spoke = any(b.spoke(index, delta) for b in bodies)
            parsed += parser.finish(cut=delta.finish_reason == "length", spoke=spoke)
        body = ChunkDelta()
        empty = not (parsed.reasoning or parsed.content or parsed.tool_calls)
        if parsed.reasoning:
            body.reasoning_content = body.reasoning = parsed.reasoning
        if parsed.content:
            body.content = parsed.content
        if parsed.tool_calls:
            body.tool_calls = [_tool_call_delta(t) for t in parsed.tool_calls]
        for b in bodies:  # a spoken turn's delta.audio (its transcript in place of content)
            b.count(delta)
            fields = b.delta(index, delta, parsed.content)
            for name, value in fields.items():
                setattr(body, name, value)
            empty = empty and not fields
            made = b.parts(delta)
            if made:
                parts.append((index, made))
        if empty and delta.finish_reason is None and not req.logprobs:
            return None  # a token that completes no character yet, or markup held back
        logprobs = _logprobs(req, tokenizer, delta.logprobs)
        out = ChatChunkChoice(index, body, logprobs, _finish_reason(delta.finish_reason, parser.made_calls))
        if delta.finish_reason is not None:
            out.stop_reason = delta.stop_reason
        return out

    def part_chunks(index: int) -> list[ChatChunkChoice]:
        """The parts (images) of the delta just sent, as chunks of their own: delta.content is
        then a list of parts, as the non-streamed message's content parts have them."""
        chunks = [ChatChunkChoice(i, ChunkDelta(content=made), None, None) for i, made in parts if i == index]
        parts.clear()
        return chunks

    await stream.run(completion.outputs, choice, lambda: _usage_body(completion.outputs, bodies), extra=part_chunks)
    for b in bodies:  # a spoken answer is kept, so a later turn can refer to it by its id
        await b.finish()
    return response


def _content_parts(text: str, parts: list[Any]) -> list[Any]:
    """A turn with parts (images): its text (when there is any), then each part, as content
    parts (the shape a user message's content takes)."""
    return ([TextPart(text)] if text else []) + parts


def _tool_call_delta(t: ParsedToolCallDelta) -> ToolCallDelta:
    fn = FunctionDelta(arguments=t.arguments)
    if t.name is not None:
        fn.name = t.name
    if t.id is None:
        return ToolCallDelta(index=t.index, function=fn)
    return ToolCallDelta(index=t.index, id=t.id, type="function", function=fn)


def _usage_body(outputs: list[OutputRouter], bodies: list[ChatBody]) -> UsageBody:
    """The token counts, and what each kind adds for all the choices (the images' decoder_details)."""
    body = usage_body(_usage(outputs))
    for b in bodies:
        for name, value in b.usage().items():
            setattr(body, name, value)
    return body


def _usage(outputs: list[OutputRouter]) -> Usage:
    # The n choices share one prompt: counted once, as OpenAI does.
    return Usage(
        prompt_tokens=outputs[0].usage.prompt_tokens,
        cached_tokens=outputs[0].usage.cached_tokens,
        completion_tokens=sum(o.usage.completion_tokens for o in outputs),
    )
