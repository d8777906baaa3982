"""A request's media items: each MediaRef (a neutral reference to one item, which
omni/serving/prompt.py makes from OpenAI's content parts) loaded to bytes and hashed.

Only bytes are handled here: decoding happens in the encoder worker, so a corrupt file costs
this server nothing but a round trip (the worker's error names the part and becomes a 400).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from omni.modalities.inputs.source import decode_base64_off_loop, load_media_bytes
from omni.shared.media import MediaLimits, is_video
from omni.shared.media.audio import media_duration_s
from omni.shared.store.keys import content_hash

_HASH_IN_THREAD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class MediaItem:
    kind: str  # image | video | audio
    param: str  # e.g. messages[0].content[1]
    data: bytes
    fmt: str | None = None
    digest: str = ""  # content_hash of data and the decode params: the key's last segment
    seconds: float | None = None  # an audio or video item's length, for prompts that state it


@dataclass(frozen=True, slots=True)
class MediaRef:
    """One media item as a request refers to it: a URL (data: or http(s)) or base64 data."""

    param: str  # where it sits in the request, e.g. messages[0].content[1]
    kind: Literal["image", "video", "audio"]  # as the request names it; the bytes may say video
    url: str | None = None
    data: str | None = None  # base64 (input_audio)
    fmt: str | None = None  # the audio's container, as the request names it


def decode_params(kind: str, limits: MediaLimits) -> dict[str, object]:
    """What besides the bytes decides an encoder's output (the rest is in the revision)."""
    params: dict[str, object] = {"kind": kind}
    if kind == "video":  # the worker samples frames by these
        params |= {"fps": limits.video_fps, "max_frames": limits.max_video_frames}
    return params


async def load_items(refs: Sequence[MediaRef], limits: MediaLimits) -> list[MediaItem]:
    """Every item in request order, loaded concurrently (a remote fetch may be slow)."""
    limits.check_num_items(len(refs), "messages")

    async def load(ref: MediaRef) -> MediaItem:
        if ref.data is not None:
            kind, data = ref.kind, await decode_base64_off_loop(ref.data, limits, ref.param)
        else:
            assert ref.url is not None
            data = await load_media_bytes(ref.url, limits, ref.param)
            # The bytes decide, not the part type: an mp4 sent as image_url is a video.
            kind = "video" if ref.kind == "video" or is_video(data) else "image"
        params = decode_params(kind, limits)
        if len(data) > _HASH_IN_THREAD_BYTES:  # keep the event loop free of long hashes
            digest = await asyncio.to_thread(content_hash, data, params)
        else:
            digest = content_hash(data, params)
        seconds = None
        if kind != "image":  # read from the container's header, off the event loop
            seconds = await asyncio.to_thread(media_duration_s, data, kind)
        return MediaItem(kind, ref.param, data, ref.fmt, digest, seconds)

    return list(await asyncio.gather(*(load(ref) for ref in refs)))
