"""One realtime response: the conversation rendered as a chat turn (omni/serving/chat.py's
chat: the same prompt, tools, spoken answers and prefix cache as POST /v1/chat/completions),
its deltas as the Realtime API's server events.

    text          -> a message item: output_text (text) or output_audio's transcript (audio)
    audio pieces  -> output_audio deltas in the session's output format
    tool calls    -> function_call items, their arguments streamed
    the end       -> every open item done, then response.done with status and usage

An item opens when its first delta arrives and is added to the conversation then (with
conversation "none", it is not). Cancelled (the client's response.cancel, or the user's
speech under server VAD), the open items end incomplete and response.done says cancelled;
closing the deltas aborts the LLM request (its KV blocks freed) and the vocoder stream.
A response that fails (refused by admission control, past its deadline, an engine's failure)
ends `failed`, after an `error` event as the HTTP API would have answered
(omni/serving/errors.py:api_error, the one mapping).
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from msgspec import UNSET

from omni.engines.generation import Delta, Usage
from omni.modalities.outputs.audio import AUDIO
from omni.serving.model import ServedModel
from omni.serving.realtime import client_events as ev
from omni.serving.realtime.conversation import Conversation, Item, new_item_id
from omni.serving.requests import ChatCompletionRequest, parse_chat_completion_request
from omni.serving.sampling import voice_priority
from omni.shared.media import g711
from omni.shared.media.audio_encoding import float_to_pcm16
from omni.shared.media.decimator import Decimator
from omni.text.parsers.tool_calls import ToolCallDelta
from omni.text.reply_parser import ChoiceParser

Event = dict[str, Any]
Emit = Callable[[Event], None]
SAMPLES_PER_UNIT = 960  # the vocoder's 24 kHz samples per audio unit (25 units a second)
log = logging.getLogger("omni.serving.realtime")


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex[:24]}"


def chat_body(
    model_name: str, model_speaks: bool, s: dict[str, Any], messages: list[dict[str, Any]], priority: int = 0
) -> dict[str, Any]:
    """The chat completion request of a response: s, the session's settings with the
    response's overrides; messages, the conversation rendered; priority: the voice priority
    (--voice-priority under the priority policy, else 0)."""
    if s["instructions"]:
        messages = [{"role": "system", "content": s["instructions"]}, *messages]
    body: dict[str, Any] = {
        "model": model_name,
        "messages": messages,
        # a spoken conversation answers at once: templates that reason first are told not to
        "chat_template_kwargs": {"skip_reasoning": True, "enable_thinking": False},
    }
    if priority:
        body["priority"] = priority
    if "audio" in s["output_modalities"]:
        body["modalities"] = ["text", "audio"]
        body["audio"] = {"voice": s["voice"], "format": "pcm16"}
    elif model_speaks:
        body["modalities"] = ["text"]
    if s["temperature"] is not None:
        body["temperature"] = s["temperature"]
    for name in ("seed", "logit_bias"):
        if s[name] is not None:
            body[name] = s[name]
    if s["max_output_tokens"] != "inf":
        body["max_completion_tokens"] = s["max_output_tokens"]
    if s["tools"]:
        body["tools"] = [{"type": "function", "function": _function(t)} for t in s["tools"]]
        choice = s["tool_choice"]
        body["tool_choice"] = choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
        body["parallel_tool_calls"] = s["parallel_tool_calls"]
    return body


def chat_request(model: ServedModel, s: dict[str, Any], messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    """chat_body's request at the voice priority, parsed as POST /v1/chat/completions parses one."""
    priority = voice_priority(model.pool.config.llm)
    return parse_chat_completion_request(chat_body(model.name, model.output(AUDIO) is not None, s, messages, priority))


def _function(tool: ev.FunctionTool) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters or {"type": "object", "properties": {}}}
    if tool.description is not UNSET:
        fn["description"] = tool.description
    return fn


@dataclass(slots=True)
class _Open:
    item: Item
    output_index: int
    text: list[str] = field(default_factory=list)
    audio_samples: int = 0  # 24 kHz samples sent, an output_audio part's


class AudioOut:
    """The vocoder's 24 kHz float samples -> the session's output format's bytes."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self._decimator = Decimator(3) if fmt != "audio/pcm" else None

    def encode(self, samples: np.ndarray) -> bytes:
        if self._decimator is None:
            return float_to_pcm16(samples)
        pcm = np.frombuffer(float_to_pcm16(self._decimator.push(samples)), dtype="<i2")
        return g711.encode(pcm, "pcmu" if self.fmt == "audio/pcmu" else "pcma")


class ResponseEvents:
    """The server events of one response, in order. conversation None: out of band."""

    def __init__(
        self, emit: Emit, response: dict[str, Any], conversation: Conversation | None,
        *, audio: bool, audio_format: str, turn_end: float | None = None,
        on_first_audio: Callable[[float], None] | None = None,
    ) -> None:  # fmt: skip
        """turn_end: when the turn this answers ended (time.monotonic()); on_first_audio is
        called with the seconds from it to the first audio delta."""
        self.emit = emit
        self.turn_end = time.monotonic() if turn_end is None else turn_end
        self.on_first_audio = on_first_audio
        self.response = response
        self.parser: ChoiceParser | None = None  # the turn's (its tools, its reasoning), once it is prepared
        self.num_media_tokens: Mapping[str, int] = {}  # the prompt's, by kind, once it is prepared
        self.conversation = conversation
        self.audio = audio
        self.audio_out = AudioOut(audio_format)
        self._message: _Open | None = None
        self._calls: dict[int, _Open] = {}
        self.audio_samples = 0

    @property
    def id(self) -> str:
        return str(self.response["id"])

    def created(self) -> None:
        self.emit({"type": "response.created", "response": dict(self.response, output=[])})

    def push(self, delta: Delta) -> None:
        assert self.parser is not None
        parsed = self.parser.push(delta.text)
        if delta.finish_reason is not None:
            parsed += self.parser.finish(cut=delta.finish_reason == "length", spoke=bool(AUDIO.pieces(delta)) or self.audio_samples > 0)
        if parsed.content:
            self._text(parsed.content)
        for call in parsed.tool_calls:
            self._call(call)
        for piece in AUDIO.pieces(delta):
            self._audio(np.frombuffer(piece.samples, dtype="<f4"))

    def done(self, status: str, usage: Usage | None, details: dict[str, Any] | None = None) -> None:
        item_status = "completed" if status == "completed" else "incomplete"
        if self._message is not None:
            self._close_message(item_status)
        for opened in self._calls.values():
            self._close_call(opened, item_status)
        self._calls.clear()
        self.response["status"] = status
        self.response["status_details"] = details
        if usage is not None:
            audio_tokens = round(self.audio_samples / SAMPLES_PER_UNIT)
            self.response["usage"] = {
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
                "input_token_details": self._input_details(usage),
                "output_token_details": {"audio_tokens": audio_tokens,
                                         "text_tokens": max(usage.completion_tokens - audio_tokens, 0)},  # fmt: skip
            }
        self.emit({"type": "response.done", "response": self.response})

    def _input_details(self, usage: Usage) -> dict[str, int]:
        """The prompt's tokens by modality: images and audio as their items expanded (embedding
        rows and codes alike), text the rest; cached, the prefix cache's share of them all."""
        image, audio = self.num_media_tokens.get("image", 0), self.num_media_tokens.get("audio", 0)
        return {"cached_tokens": usage.cached_tokens, "text_tokens": max(usage.prompt_tokens - image - audio, 0),
                "image_tokens": image, "audio_tokens": audio}  # fmt: skip

    # ---------------------------------------------------------------- items

    def _add(self, item: Item) -> _Open:
        output = self.response["output"]
        output.append(item)
        opened = _Open(item, len(output) - 1)
        self.emit({"type": "response.output_item.added", "response_id": self.id, "output_index": opened.output_index,
                   "item": dict(item)})  # fmt: skip
        if self.conversation is not None:
            previous = self.conversation.add(item)
            self.emit({"type": "conversation.item.added", "previous_item_id": previous, "item": dict(item)})
        return opened

    def _finish(self, opened: _Open, status: str) -> None:
        opened.item["status"] = status
        self.emit({"type": "response.output_item.done", "response_id": self.id, "output_index": opened.output_index,
                   "item": opened.item})  # fmt: skip
        if self.conversation is not None and opened.item in self.conversation.items:
            previous = self.conversation.previous_id(opened.item["id"])
            self.emit({"type": "conversation.item.done", "previous_item_id": previous, "item": opened.item})

    def _ids(self, opened: _Open) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": opened.item["id"], "output_index": opened.output_index,
                "content_index": 0}  # fmt: skip

    def _open_message(self) -> _Open:
        if self._message is None:
            item = {"id": new_item_id(), "object": "realtime.item", "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}  # fmt: skip
            self._message = self._add(item)
            # the events' part is typed "audio" or "text" (the item's content: output_audio, output_text)
            part = {"type": "audio", "transcript": ""} if self.audio else {"type": "text", "text": ""}
            self.emit({"type": "response.content_part.added", **self._ids(self._message), "part": part})
        return self._message

    def _text(self, text: str) -> None:
        opened = self._open_message()
        opened.text.append(text)
        kind = "response.output_audio_transcript.delta" if self.audio else "response.output_text.delta"
        self.emit({"type": kind, **self._ids(opened), "delta": text})

    def _audio(self, samples: np.ndarray) -> None:
        opened = self._open_message()
        opened.audio_samples += len(samples)
        self.audio_samples += len(samples)
        data = self.audio_out.encode(samples)
        if data:
            self.emit({"type": "response.output_audio.delta", **self._ids(opened), "delta": base64.b64encode(data).decode()})
            if self.on_first_audio is not None:
                self.on_first_audio(time.monotonic() - self.turn_end)
                self.on_first_audio = None

    def _close_message(self, status: str) -> None:
        opened, self._message = self._message, None
        assert opened is not None
        text = "".join(opened.text)
        ids = self._ids(opened)
        if self.audio:
            part = {"type": "output_audio", "transcript": text}
            self.emit({"type": "response.output_audio_transcript.done", **ids, "transcript": text})
            self.emit({"type": "response.output_audio.done", **ids})
            if self.conversation is not None:
                self.conversation.set_spoken_ms(opened.item["id"], 0, opened.audio_samples * 1000 // 24000)
        else:
            part = {"type": "output_text", "text": text}
            self.emit({"type": "response.output_text.done", **ids, "text": text})
        opened.item["content"] = [part]
        event_part = {"type": "audio", "transcript": text} if self.audio else {"type": "text", "text": text}
        self.emit({"type": "response.content_part.done", **ids, "part": event_part})
        self._finish(opened, status)

    def _call(self, call: ToolCallDelta) -> None:
        opened = self._calls.get(call.index)
        if opened is None:
            if self._message is not None:  # the text before a call ends with it
                self._close_message("completed")
            # so do the calls before it: they are whole, and only the last call can be cut (the
            # length limit leaves that one incomplete, as the Responses API's, and no other)
            for before in self._calls.values():
                self._close_call(before, "completed")
            self._calls.clear()
            item = {"id": new_item_id(), "object": "realtime.item", "type": "function_call", "status": "in_progress",
                    "call_id": call.id or f"call_{uuid.uuid4().hex[:16]}", "name": call.name or "", "arguments": ""}  # fmt: skip
            opened = self._calls[call.index] = self._add(item)
        if call.arguments:
            opened.text.append(call.arguments)
            self.emit({"type": "response.function_call_arguments.delta", "response_id": self.id,
                       "item_id": opened.item["id"], "output_index": opened.output_index,
                       "call_id": opened.item["call_id"], "delta": call.arguments})  # fmt: skip

    def _close_call(self, opened: _Open, status: str) -> None:
        item = opened.item
        item["arguments"] = "".join(opened.text)
        self.emit({"type": "response.function_call_arguments.done", "response_id": self.id, "item_id": item["id"],
                   "output_index": opened.output_index, "call_id": item["call_id"], "name": item["name"],
                   "arguments": item["arguments"]})  # fmt: skip
        self._finish(opened, status)
