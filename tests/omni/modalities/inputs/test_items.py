"""Media items: each reference loaded to bytes in request order, its kind the bytes' (a video
sent as an image URL is a video), its digest over the bytes and the decode params, and an audio
item's length read from its container."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from omni.modalities.inputs.items import MediaRef, decode_params, load_items
from omni.shared.media import MediaLimits
from omni.shared.media.audio_encoding import encode_audio
from omni.shared.media.errors import MediaError
from omni.shared.store.keys import content_hash

PNG_ISH = b"\x89PNG\r\n\x1a\n" + bytes(8)
MP4_ISH = b"\x00\x00\x00\x18ftypisom" + bytes(12)


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def test_decode_params_name_what_besides_the_bytes_shapes_the_output() -> None:
    limits = MediaLimits()
    assert decode_params("image", limits) == {"kind": "image"}
    assert decode_params("video", limits) == {"kind": "video", "fps": limits.video_fps, "max_frames": limits.max_video_frames}


async def test_items_load_in_order_with_their_kind_and_digest() -> None:
    limits = MediaLimits()
    wav = encode_audio(np.zeros(12000, dtype=np.float32), 24000, "wav")
    refs = [
        MediaRef("m[0].c[0]", "image", url=data_url("image/png", PNG_ISH)),
        MediaRef("m[0].c[1]", "image", url=data_url("video/mp4", MP4_ISH)),  # the bytes say video
        MediaRef("m[0].c[2]", "audio", data=base64.b64encode(wav).decode(), fmt="wav"),
    ]
    image, video, audio = await load_items(refs, limits)
    assert [(i.kind, i.param, i.fmt) for i in (image, video, audio)] == [
        ("image", "m[0].c[0]", None), ("video", "m[0].c[1]", None), ("audio", "m[0].c[2]", "wav"),
    ]  # fmt: skip
    assert (image.data, video.data, audio.data) == (PNG_ISH, MP4_ISH, wav)
    assert image.digest == content_hash(PNG_ISH, {"kind": "image"})
    assert video.digest == content_hash(MP4_ISH, decode_params("video", limits))
    assert image.seconds is None
    assert audio.seconds == pytest.approx(0.5)


async def test_too_many_items_are_refused_before_any_is_loaded() -> None:
    limits = MediaLimits(max_items_per_request=1)
    refs = [MediaRef(f"m[0].c[{i}]", "image", url=data_url("image/png", PNG_ISH)) for i in range(2)]
    with pytest.raises(MediaError, match="2 media items in one request; at most 1"):
        await load_items(refs, limits)
