"""One Responses API turn as its output items and the stream events that build them, from the
choice's deltas (omni/http/handlers/responses.py runs it; a whole response is the same
events unsent, so streamed and not give the same output).

The items open in the order the model writes them and each closes when the next opens:
reasoning (its text as the summary), message (one output_text part), function_call (one per
call), image_generation_call (the drawn image as base64; on a model that draws by calling
t2i_model_generation, that call is the image and no function_call). Event shapes are those
of the openai package's types/responses (ResponseTextDeltaEvent, ...): every event has its
type and a sequence_number counting from 0.
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

from omni.engines.generation import Delta, Usage
from omni.modalities.outputs.image import IMAGE, GeneratedImage, ImagePreview
from omni.modalities.outputs.image_chat import decoder_details
from omni.serving.responses.turn import assistant_message
from omni.text.parsers.tool_calls import ToolCallDelta
from omni.text.parsers.tool_grammar import T2I_TOOL
from omni.text.reply_parser import ChoiceParser, OutputFormat

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class _Open:
    item: dict[str, Any]
    index: int  # output_index
    text: list[str] = field(default_factory=list)
    claimed: bool = False  # an image item: a t2i_model_generation call is its call


class ResponseEvents:
    """response: the Response object (status, output and usage are filled as the turn runs).
    t2i_call: the model draws by calling t2i_model_generation. image: the tool's size and
    format, echoed on the image item."""

    def __init__(self, response: dict[str, Any], fmt: OutputFormat, *, t2i_call: bool, output_format: str = "png") -> None:
        self.response = response
        self.parser: ChoiceParser = fmt.new_parser()
        self.t2i_call = t2i_call
        self.output_format = output_format
        self.sequence = 0
        self._open: _Open | None = None
        self._calls: dict[int, _Open] = {}  # the parser's call index -> its function_call item
        self._drawing: set[int] = set()  # call indices that are t2i_model_generation (images)
        self._unclaimed = 0  # images drawn before the parser named their call (it may hold the name back)
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._made_calls: list[dict[str, Any]] = []
        self.reasoning_tokens = 0
        self._drawn: list[GeneratedImage] = []  # for the usage's decoder_details

    @property
    def output(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.response["output"]
        return out

    def event(self, kind: str, **fields: Any) -> Event:
        out = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return out

    def start(self) -> list[Event]:
        self.response["status"] = "in_progress"
        snapshot = dict(self.response, output=[])
        return [self.event("response.created", response=snapshot), self.event("response.in_progress", response=snapshot)]

    # ------------------------------------------------------------------ the model's output

    def push(self, delta: Delta) -> list[Event]:
        parsed = self.parser.push(delta.text)
        if delta.finish_reason is not None:
            parsed += self.parser.finish(cut=delta.finish_reason == "length")
        events: list[Event] = []
        if parsed.reasoning:
            self.reasoning_tokens += len(delta.token_ids) if not parsed.content else 0
            events += self._reasoning_text(parsed.reasoning)
        if parsed.content:
            events += self._text(parsed.content)
        for call in parsed.tool_calls:
            events += self._call(call)
        for image in IMAGE.pieces(delta):
            events += self._image(image)
        return events

    def preview(self, preview: ImagePreview) -> list[Event]:
        events, item = self._image_item()
        events.append(
            self.event(
                "response.image_generation_call.partial_image", item_id=item.item["id"], output_index=item.index,
                partial_image_index=preview.index, partial_image_b64=_b64(preview.data), size=preview.size,
                output_format=self.output_format, quality="auto", background="opaque",
            )
        )  # fmt: skip
        return events

    def finish(self, finish_reason: str | None, usage: Usage) -> list[Event]:
        cut = finish_reason == "length"
        events = self._close(status="incomplete" if cut else "completed")
        self.response["status"] = "incomplete" if cut else "completed"
        if cut:
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
        self.response["completed_at"] = int(time.time())
        self.response["usage"] = {
            "input_tokens": usage.prompt_tokens,
            # the prompt tokens this turn computed, which the prefix cache keeps (whole blocks of them)
            "input_tokens_details": {"cached_tokens": usage.cached_tokens,
                                     "cache_write_tokens": usage.prompt_tokens - usage.cached_tokens},  # fmt: skip
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        }
        if self._drawn:  # ours, as the images API's usage: the decoder's work for the images
            self.response["usage"]["decoder_details"] = msgspec.structs.asdict(decoder_details(self._drawn))
        kind = "response.incomplete" if cut else "response.completed"
        return [*events, self.event(kind, response=self.response)]

    def fail(self, code: str, message: str) -> list[Event]:
        events = self._close(status="incomplete")
        self.response["status"] = "failed"
        self.response["error"] = {"code": code, "message": message}
        return [*events, self.event("error", code=code, message=message, param=None),
                self.event("response.failed", response=self.response)]  # fmt: skip

    def assistant_message(self) -> dict[str, Any]:
        """The turn as the chat message a follow-up renders."""
        return assistant_message("".join(self._content), "".join(self._reasoning), self._made_calls)

    # ------------------------------------------------------------------ items

    def _begin(self, item: dict[str, Any]) -> tuple[list[Event], _Open]:
        events = self._close(status="completed")
        self.output.append(item)
        self._open = _Open(item, len(self.output) - 1)
        return [*events, self.event("response.output_item.added", output_index=self._open.index, item=dict(item))], self._open

    def _close(self, *, status: str) -> list[Event]:
        opened, self._open = self._open, None
        if opened is None:
            return []
        item, index = opened.item, opened.index
        text = "".join(opened.text)
        events: list[Event] = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item["content"] = [part]
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events += [self.event("response.output_text.done", **ids, text=text, logprobs=[]),
                       self.event("response.content_part.done", **ids, part=part)]  # fmt: skip
        elif item["type"] == "reasoning":
            summary = {"type": "summary_text", "text": text}
            item["summary"] = [summary]
            ids = {"item_id": item["id"], "output_index": index, "summary_index": 0}
            events += [self.event("response.reasoning_summary_text.done", **ids, text=text),
                       self.event("response.reasoning_summary_part.done", **ids, part=summary)]  # fmt: skip
        elif item["type"] == "function_call":
            item["arguments"] = text
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                     output_index=index, name=item["name"], arguments=text))  # fmt: skip
            self._made_calls.append(
                {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": text}}
            )
        elif item["type"] == "image_generation_call" and item["status"] != "completed":
            item["status"] = "failed"  # the span ended without an image (cut short, say)
        if item["type"] != "image_generation_call":
            item["status"] = status
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events

    def _reasoning_text(self, text: str) -> list[Event]:
        self._reasoning.append(text)
        events: list[Event] = []
        opened = self._open
        if opened is None or opened.item["type"] != "reasoning":
            events, opened = self._begin({"id": new_id("rs"), "type": "reasoning", "summary": []})
            events.append(self.event("response.reasoning_summary_part.added", item_id=opened.item["id"],
                                     output_index=opened.index, summary_index=0,
                                     part={"type": "summary_text", "text": ""}))  # fmt: skip
        opened.text.append(text)
        events.append(self.event("response.reasoning_summary_text.delta", item_id=opened.item["id"],
                                 output_index=opened.index, summary_index=0, delta=text))  # fmt: skip
        return events

    def _text(self, text: str) -> list[Event]:
        self._content.append(text)
        events: list[Event] = []
        opened = self._open
        if opened is None or opened.item["type"] != "message":
            item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            events, opened = self._begin(item)
            events.append(self.event("response.content_part.added", item_id=item["id"], output_index=opened.index,
                                     content_index=0, part={"type": "output_text", "text": "", "annotations": []}))  # fmt: skip
        opened.text.append(text)
        events.append(self.event("response.output_text.delta", item_id=opened.item["id"], output_index=opened.index,
                                 content_index=0, delta=text, logprobs=[]))  # fmt: skip
        return events

    def _call(self, call: ToolCallDelta) -> list[Event]:
        if call.index in self._drawing:
            return []  # the image's codes, as the call's argument: the image item says it
        events: list[Event] = []
        opened = self._calls.get(call.index)
        if opened is None:
            if self.t2i_call and call.name == T2I_TOOL:
                self._drawing.add(call.index)
                if self._unclaimed:  # its image came out already
                    self._unclaimed -= 1
                    return []
                events, image = self._image_item()
                image.claimed = True
                return events
            item = {"id": new_id("fc"), "type": "function_call", "call_id": call.id or new_id("call"),
                    "name": call.name or "", "arguments": "", "status": "in_progress"}  # fmt: skip
            events, opened = self._begin(item)
            self._calls[call.index] = opened
        if call.arguments:
            opened.text.append(call.arguments)
            events.append(self.event("response.function_call_arguments.delta", item_id=opened.item["id"],
                                     output_index=opened.index, delta=call.arguments))  # fmt: skip
        return events

    def _image_item(self) -> tuple[list[Event], _Open]:
        """The image being drawn: the open one, or a new one (in progress, generating)."""
        opened = self._open
        if opened is not None and opened.item["type"] == "image_generation_call" and opened.item["status"] != "completed":
            return [], opened
        item = {"id": new_id("ig"), "type": "image_generation_call", "status": "in_progress", "result": None}
        events, opened = self._begin(item)
        ids = {"item_id": item["id"], "output_index": opened.index}
        events += [self.event("response.image_generation_call.in_progress", **ids),
                   self.event("response.image_generation_call.generating", **ids)]  # fmt: skip
        item["status"] = "generating"
        return events, opened

    def _image(self, image: GeneratedImage) -> list[Event]:
        self._drawn.append(image)
        events, opened = self._image_item()
        if self.t2i_call and not opened.claimed:
            self._unclaimed += 1
        item = opened.item
        item |= {"status": "completed", "result": _b64(image.data), "size": f"{image.width}x{image.height}",
                 "output_format": self.output_format, "quality": "auto", "background": "opaque"}  # fmt: skip
        events.append(self.event("response.image_generation_call.completed", item_id=item["id"], output_index=opened.index))
        return [*events, *self._close(status="completed")]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
