"""POST /v1/chat/completions: the handler, and the chat response format. The lifecycle itself
is omni.serving.chat.chat."""

from __future__ import annotations

import base64
import time

import numpy as np
from aiohttp import web
from msgspec import UNSET

from omni.engines.generation import Delta, TokenLogprob, Usage
from omni.http import sse
from omni.http.access_log import client_request_id, note_generation
from omni.http.body import body_timeout, read_parsed, request_timeout
from omni.http.logprobs import chat_logprob_entries, prompt_logprobs_json
from omni.http.state import MODELS, STORE
from omni.modalities.outputs.audio import AUDIO, AUDIO_EXPIRES_S, AudioPiece, new_audio_id, store_spoken
from omni.modalities.outputs.image import IMAGE, GeneratedImage
from omni.modalities.outputs.router import OutputRouter
from omni.serving import chat as lifecycle
from omni.serving.bodies import (
    AudioDelta,
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
    MessageAudio,
    OutputFunction,
    OutputImagePart,
    OutputImageURL,
    OutputToolCall,
    ToolCallDelta,
    finish_reason,
    usage_body,
)
from omni.serving.prepared import Completion
from omni.serving.requests import ChatCompletionRequest, parse_chat_completion_request
from omni.serving.requests.chat import TextPart
from omni.serving.spoken import ChatAudio
from omni.shared.media.audio_encoding import float_to_pcm16
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
    choices = []
    for i, c in enumerate(collected):
        parser = fmt.new_parser()
        drawn, spoken = IMAGE.pieces(c), AUDIO.pieces(c)
        reply = parser.parse(c.text, cut=c.finish_reason == "length", spoke=bool(spoken))
        message = ChatCompletionMessage(role="assistant", content=echo + reply.content)
        if drawn and not completion.inline_images:
            message.content = _content_parts(echo + reply.content, drawn)
        if reply.tool_calls:
            message.tool_calls = [
                OutputToolCall(t.id, "function", OutputFunction(t.name, t.arguments)) for t in reply.tool_calls
            ]
            if not message.content:
                message.content = None  # as OpenAI answers a turn that only calls tools
        if fmt.reasoning_parser is not None:
            message.reasoning_content = message.reasoning = reply.reasoning
        if spoken and completion.audio is not None:
            message.audio = await _spoken(request, completion.audio, spoken, reply.content or "")
            message.content = None  # a spoken turn's text is its transcript, as OpenAI answers
        logprobs = _logprobs(req, tokenizer, c.logprobs)
        choices.append(ChatChoice(i, message, logprobs, _finish_reason(c.finish_reason, parser.made_calls), c.stop_reason))
    body = ChatCompletion(
        id=completion.id,
        object="chat.completion",
        created=int(time.time()),
        model=completion.model.name,
        choices=choices,
        usage=usage_body(_usage(completion.outputs)),
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
    images: list[tuple[int, list[GeneratedImage]]] = []  # decoded on the delta choice() just read
    speaking = completion.audio
    audio_ids = [new_audio_id() for _ in completion.outputs]
    spoken: list[list[AudioPiece]] = [[] for _ in completion.outputs]  # each choice's audio, to store at the end
    transcripts: list[list[str]] = [[] for _ in completion.outputs]

    def choice(index: int, delta: Delta) -> ChatChunkChoice | None:
        parser = parsers[index]
        parsed = parser.push(delta.text)
        if delta.finish_reason is not None:
            parsed += parser.finish(cut=delta.finish_reason == "length", spoke=bool(spoken[index] or AUDIO.pieces(delta)))
        body = ChunkDelta()
        empty = not (parsed.reasoning or parsed.content or parsed.tool_calls)
        if parsed.reasoning:
            body.reasoning_content = body.reasoning = parsed.reasoning
        if parsed.content:
            body.content = parsed.content
        if parsed.tool_calls:
            body.tool_calls = [_tool_call_delta(t) for t in parsed.tool_calls]
        if speaking is not None:
            transcripts[index].append(parsed.content)
            audio = _audio_delta(audio_ids[index], delta, parsed.content)
            if audio is not None:
                if audio.transcript is not UNSET:
                    body.content = UNSET  # a spoken turn's text is its transcript
                body.audio = audio
                empty = False
            spoken[index].extend(AUDIO.pieces(delta))
        drawn = IMAGE.pieces(delta)
        if drawn and not completion.inline_images:
            images.append((index, drawn))
        if empty and delta.finish_reason is None and not req.logprobs:
            return None  # a token that completes no character yet, or markup held back
        logprobs = _logprobs(req, tokenizer, delta.logprobs)
        out = ChatChunkChoice(index, body, logprobs, _finish_reason(delta.finish_reason, parser.made_calls))
        if delta.finish_reason is not None:
            out.stop_reason = delta.stop_reason
        return out

    def image_chunks(index: int) -> list[ChatChunkChoice]:
        """The images of the delta just sent, as chunks of their own: delta.content is then a
        list of image parts, as the non-streamed message's content parts have them."""
        chunks = [
            ChatChunkChoice(i, ChunkDelta(content=[_image_part(image) for image in drawn]), None, None)
            for i, drawn in images
            if i == index
        ]
        images.clear()
        return chunks

    await stream.run(completion.outputs, choice, lambda: _usage(completion.outputs), extra=image_chunks)
    if speaking is not None:  # kept, so a later turn can refer to the audio by its id
        for audio_id, pieces, said in zip(audio_ids, spoken, transcripts, strict=True):
            if pieces:
                await store_spoken(speaking.audio.store, audio_id, _samples(pieces), "wav", "".join(said))
    return response


def _audio_delta(audio_id: str, delta: Delta, content: str) -> AudioDelta | None:
    """A streamed chunk's delta.audio (OpenAI's shape): the id, base64 PCM16 of the samples
    this delta completed, the transcript (a spoken turn's text, which then leaves content),
    and expires_at on the last; None when it has none of them."""
    audio = AudioDelta(id=audio_id)
    pieces = AUDIO.pieces(delta)
    if pieces:
        pcm = float_to_pcm16(_samples(pieces))
        audio.data = base64.b64encode(pcm).decode()
    if content:
        audio.transcript = content
    some = audio.data is not UNSET or audio.transcript is not UNSET
    if delta.finish_reason is not None:
        audio.expires_at = int(time.time()) + AUDIO_EXPIRES_S
        some = True
    return audio if some else None


def _samples(pieces: list[AudioPiece]) -> np.ndarray:
    return np.concatenate([np.frombuffer(p.samples, dtype="<f4") for p in pieces])


async def _spoken(request: web.Request, speaking: ChatAudio, pieces: list[AudioPiece], transcript: str) -> MessageAudio:
    """A non-streamed turn's message.audio: the audio in the asked format (base64 of the
    file's bytes), stored under its id."""
    audio_id = new_audio_id()
    data = await store_spoken(speaking.audio.store, audio_id, _samples(pieces), speaking.format, transcript)
    expires_at = int(time.time()) + AUDIO_EXPIRES_S
    return MessageAudio(audio_id, base64.b64encode(data).decode(), expires_at, transcript)


def _image_part(image: GeneratedImage) -> OutputImagePart:
    return OutputImagePart(OutputImageURL(image.url))


def _content_parts(text: str, images: list[GeneratedImage]) -> list[TextPart | OutputImagePart]:
    """A turn with images: its text (when there is any), then each image, as content parts
    (the shape a user message's content takes)."""
    parts: list[TextPart | OutputImagePart] = [TextPart(text)] if text else []
    return parts + [_image_part(image) for image in images]


def _tool_call_delta(t: ParsedToolCallDelta) -> ToolCallDelta:
    fn = FunctionDelta(arguments=t.arguments)
    if t.name is not None:
        fn.name = t.name
    if t.id is None:
        return ToolCallDelta(index=t.index, function=fn)
    return ToolCallDelta(index=t.index, id=t.id, type="function", function=fn)


def _usage(outputs: list[OutputRouter]) -> Usage:
    # The n choices share one prompt: counted once, as OpenAI does.
    return Usage(
        prompt_tokens=outputs[0].usage.prompt_tokens,
        cached_tokens=outputs[0].usage.cached_tokens,
        completion_tokens=sum(o.usage.completion_tokens for o in outputs),
    )
