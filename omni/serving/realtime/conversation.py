"""One realtime session's conversation: its items in order, as the Realtime API shows them
(the openai package's ConversationItem shapes), and as the chat messages a turn's prompt is
rendered from.

    message (user)        -> a user message: input_text parts as text, input_audio parts as
                             input_audio (WAV, the session's own samples), input_image parts as
                             image_url (a data URL of the checked bytes: input_image.py); the
                             same bytes every turn, so the encoder cache and the prefix cache
                             hold them
    message (assistant)   -> an assistant message: its text, or its audio's transcript
    message (system)      -> a system message
    function_call         -> an assistant tool call (calls in a row join one message)
    function_call_output  -> a tool message

Truncating an assistant item's audio at audio_end_ms keeps the words of its transcript in that
share of its audio's length (the transcript is written before its speech, so no timing ties a
word to a time): the next turn's prompt holds only what the user heard.
"""

from __future__ import annotations

import base64
import io
import uuid
import wave
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni.errors import APIError, bad_request

Item = dict[str, Any]


def new_item_id() -> str:
    return f"item_{uuid.uuid4().hex[:24]}"


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """int16 mono samples as a WAV file."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(samples.astype("<i2").tobytes())
    return buf.getvalue()


@dataclass(slots=True)
class _Audio:
    wav_b64: str | None  # a user item's audio, as it renders
    duration_ms: int  # an assistant item's, for truncation


@dataclass(slots=True)
class Conversation:
    items: list[Item] = field(default_factory=list)
    _audio: dict[tuple[str, int], _Audio] = field(default_factory=dict)  # (item id, content index)
    _images: dict[tuple[str, int], str] = field(default_factory=dict)  # (item id, content index) -> data URL

    def index(self, item_id: str, param: str = "item_id") -> int:
        for i, item in enumerate(self.items):
            if item["id"] == item_id:
                return i
        raise not_found(item_id, param)

    def get(self, item_id: str) -> Item:
        return self.items[self.index(item_id)]

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert after previous_item_id ("root": first; None: last); the id before it, if any."""
        if any(i["id"] == item["id"] for i in self.items):
            raise bad_request(f"An item with id '{item['id']}' is already in the conversation.", param="item.id")
        if previous_item_id is None:
            at = len(self.items)
        elif previous_item_id == "root":
            at = 0
        else:
            at = self.index(previous_item_id, "previous_item_id") + 1
        self.items.insert(at, item)
        return self.items[at - 1]["id"] if at > 0 else None

    def previous_id(self, item_id: str) -> str | None:
        at = self.index(item_id)
        return self.items[at - 1]["id"] if at > 0 else None

    def delete(self, item_id: str) -> None:
        del self.items[self.index(item_id)]
        for key in [k for k in self._audio if k[0] == item_id]:
            del self._audio[key]
        for key in [k for k in self._images if k[0] == item_id]:
            del self._images[key]

    def set_user_audio(self, item_id: str, content_index: int, wav: bytes) -> None:
        self._audio[(item_id, content_index)] = _Audio(base64.b64encode(wav).decode(), 0)

    def set_user_image(self, item_id: str, content_index: int, data_url: str) -> None:
        self._images[(item_id, content_index)] = data_url

    def set_spoken_ms(self, item_id: str, content_index: int, duration_ms: int) -> None:
        self._audio[(item_id, content_index)] = _Audio(None, duration_ms)

    def truncate(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        item = self.get(item_id)
        if item["type"] != "message" or item["role"] != "assistant":
            raise bad_request("Only an assistant message's audio can be truncated.", param="item_id")
        content = item["content"]
        if content_index >= len(content) or content[content_index]["type"] != "output_audio":
            raise bad_request(f"Content {content_index} of item '{item_id}' is no output_audio.", param="content_index")
        audio = self._audio.get((item_id, content_index))
        duration = audio.duration_ms if audio is not None else 0
        if audio_end_ms > duration:
            raise bad_request(
                f"audio_end_ms {audio_end_ms} is past the audio's end ({duration} ms).", param="audio_end_ms",
                code="invalid_value",
            )  # fmt: skip
        part = content[content_index]
        words = (part.get("transcript") or "").split()
        keep = len(words) * audio_end_ms // duration if duration else 0
        part["transcript"] = " ".join(words[:keep])
        self._audio[(item_id, content_index)] = _Audio(None, audio_end_ms)

    def messages(self, items: list[Item] | None = None, max_media: int | None = None) -> list[dict[str, Any]]:
        """The items as chat messages, in order. max_media: the most media parts one request
        takes (MediaLimits.max_items_per_request); a conversation with more renders its oldest
        user audio as its transcript (a message of audio alone with none is left out), so a
        long spoken session goes on answering instead of failing every turn from then on."""
        items = self.items if items is None else items
        as_text = self._oldest_media(items, max_media)
        out: list[dict[str, Any]] = []
        for item in items:
            kind = item["type"]
            if kind == "function_call":
                call = {"id": item["call_id"], "type": "function",
                        "function": {"name": item["name"], "arguments": item["arguments"]}}  # fmt: skip
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                    last["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
            elif item["role"] == "user":
                parts = [self._user_part(item["id"], i, p, as_text) for i, p in enumerate(item["content"])]
                kept = [p for p in parts if p is not None]
                if kept or not any(key[0] == item["id"] for key in as_text):  # (a message of no part is refused)
                    out.append({"role": "user", "content": kept})
            else:
                text = "".join(p.get("text") or p.get("transcript") or "" for p in item["content"])
                out.append({"role": item["role"], "content": text})
        return out

    def _oldest_media(self, items: list[Item], max_media: int | None) -> set[tuple[str, int]]:
        """The oldest user audio parts to render as their transcripts so that the audio and the
        images together are at most max_media (images have no text to stand for them: when they
        alone pass it, truncation.py leaves out the oldest messages)."""
        if max_media is None:
            return set()
        parts = [
            (item["id"], i, part["type"])
            for item in items
            if item["type"] == "message" and item["role"] == "user"
            for i, part in enumerate(item["content"])
        ]
        audio = [(item_id, i) for item_id, i, kind in parts if kind == "input_audio" and self._wav(item_id, i) is not None]
        images = sum(kind == "input_image" for _, _, kind in parts)
        return set(audio[: max(len(audio) + images - max_media, 0)])

    def _wav(self, item_id: str, index: int) -> str | None:
        audio = self._audio.get((item_id, index))
        return None if audio is None else audio.wav_b64

    def _user_part(self, item_id: str, index: int, part: dict[str, Any], as_text: set[tuple[str, int]]) -> dict[str, Any] | None:
        if part["type"] == "input_text":
            return {"type": "text", "text": part["text"]}
        if part["type"] == "input_image":
            return {"type": "image_url", "image_url": {"url": self._images[(item_id, index)]}}
        audio = self._audio.get((item_id, index))
        if audio is None or audio.wav_b64 is None or (item_id, index) in as_text:  # as a transcript only
            return {"type": "text", "text": part.get("transcript") or ""} if part.get("transcript") else None
        return {"type": "input_audio", "input_audio": {"data": audio.wav_b64, "format": "wav"}}


def not_found(item_id: str, param: str = "item_id") -> APIError:
    return bad_request(f"Item with item_id '{item_id}' not found.", param=param, code="item_not_found")
