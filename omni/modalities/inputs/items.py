"""A chat request's media items: each non-text part loaded to bytes and hashed, and the chat
template's view of the messages, with one {"type": kind, "id": ...} part per item.

Only bytes are handled here: decoding happens in the encoder worker, so a corrupt file costs
this server nothing but a round trip (the worker's error names the part and becomes a 400).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from omni.serving.requests import ChatMessage, ImageURLPart, InputAudioPart, TextPart, VideoURLPart
from omni.shared.media import MediaLimits, is_video
from omni.modalities.inputs.source import decode_base64_off_loop, load_media_bytes
from omni.shared.store.keys import content_hash

_HASH_IN_THREAD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class MediaItem:
    kind: str  # image | video | audio
    param: str  # e.g. messages[0].content[1]
    data: bytes
    fmt: str | None = None
    digest: str = ""  # content_hash of data and the decode params: the key's last segment


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


def decode_params(kind: str, limits: MediaLimits) -> dict[str, object]:
    """What besides the bytes decides an encoder's output (the rest is in the revision)."""
    params: dict[str, object] = {"kind": kind}
    if kind == "video":  # the worker samples frames by these
        params |= {"fps": limits.video_fps, "max_frames": limits.max_video_frames}
    return params


async def load_items(messages: Sequence[ChatMessage], limits: MediaLimits) -> list[MediaItem]:
    """Every media part in message order, loaded concurrently (a remote fetch may be slow)."""
    parts = media_parts(messages)
    limits.check_num_items(len(parts), "messages")

    async def load(param: str, part: MediaPart) -> MediaItem:
        fmt = None
        if isinstance(part, InputAudioPart):
            kind, data, fmt = "audio", await decode_base64_off_loop(part.data, limits, param), part.format
        else:
            data = await load_media_bytes(part.url, limits, param)
            # The bytes decide, not the part type: an mp4 sent as image_url is a video.
            kind = "video" if isinstance(part, VideoURLPart) or is_video(data) else "image"
        params = decode_params(kind, limits)
        if len(data) > _HASH_IN_THREAD_BYTES:  # keep the event loop free of long hashes
            digest = await asyncio.to_thread(content_hash, data, params)
        else:
            digest = content_hash(data, params)
        return MediaItem(kind, param, data, fmt, digest)

    return list(await asyncio.gather(*(load(p, part) for p, part in parts)))


def template_messages(messages: Sequence[ChatMessage], items: Sequence[MediaItem]) -> list[dict[str, Any]]:
    """Messages for the chat template: each media part becomes {"type": kind, "id": ...}
    (transformers' multimodal template convention); the template renders placeholders."""
    by_param = {item.param: item for item in items}
    counts: dict[str, int] = {}
    out = []
    for i, message in enumerate(messages):
        d = message.to_template_dict()
        if isinstance(message.content, tuple):
            content = []
            for j, part in enumerate(message.content):
                if isinstance(part, TextPart):
                    content.append({"type": "text", "text": part.text})
                    continue
                item = by_param[f"messages[{i}].content[{j}]"]
                n = counts[item.kind] = counts.get(item.kind, 0) + 1
                content.append({"type": item.kind, "id": f"{item.kind}_{n - 1}"})
            d["content"] = content
        out.append(d)
    return out
