"""Base64 media is decoded a window at a time, off the event loop when long: the same bytes as
one b64decode over the whole, and the same refusals."""

from __future__ import annotations

import asyncio
import base64
import os
import threading

import pytest

from omni.modalities.inputs import source
from omni.modalities.inputs.source import decode_base64, load_media_bytes
from omni.shared.media import MediaError, MediaLimits

LIMITS = MediaLimits(max_bytes=10_000)


@pytest.fixture(autouse=True)
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "_BASE64_WINDOW", 8)
    monkeypatch.setattr(source, "DECODE_IN_THREAD_CHARS", 64)


@pytest.mark.parametrize("size", [0, 1, 2, 3, 5, 6, 7, 12, 13, 40, 100])
@pytest.mark.parametrize("space", ["", " ", "\n\t "])
def test_windows_decode_as_one_call(size: int, space: str) -> None:
    raw = os.urandom(size)
    text = space + base64.b64encode(raw).decode() + space
    assert decode_base64(text, LIMITS, "input_audio.data") == raw
    url = "data:image/png;base64," + text
    assert asyncio.run(load_media_bytes(url, LIMITS, "messages[0].content[0]")) == raw


@pytest.mark.parametrize("text", ["QQ", "QQ=", "Q===", "QUJD=QUJD", "QUJDQUJDQQ==QUJD", "QUJD QUJD", "QUJD*"])
def test_invalid_base64_is_refused_in_any_window(text: str) -> None:
    with pytest.raises(ValueError):
        base64.b64decode(text, validate=True)
    with pytest.raises(MediaError, match="Invalid base64"):
        decode_base64(text, LIMITS, "input_audio.data")


def test_a_long_data_url_is_decoded_in_a_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    threads = []
    decode = source.decode_base64

    def spy(*args: object, **kwargs: object) -> bytes:
        threads.append(threading.current_thread())
        return decode(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(source, "decode_base64", spy)
    raw = os.urandom(300)
    url = "data:image/png;base64," + base64.b64encode(raw).decode()
    assert asyncio.run(load_media_bytes(url, LIMITS, "messages[0].content[0]")) == raw
    assert threads and threads[0] is not threading.main_thread()


def test_a_malformed_data_url_is_refused() -> None:
    with pytest.raises(MediaError, match="Malformed data URL"):
        asyncio.run(load_media_bytes("data:image/png;base64" + "Q" * 100, LIMITS, "p"))
