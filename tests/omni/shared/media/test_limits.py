import dataclasses

import pytest

from omni.shared.media.errors import MediaError
from omni.shared.media.limits import MediaLimits


def test_defaults() -> None:
    limits = MediaLimits()
    assert limits.max_bytes == 20 * 1024 * 1024
    assert limits.max_image_pixels == 33_177_600
    assert limits.max_audio_seconds == 600
    assert limits.max_video_frames == 128
    assert limits.video_fps == 2.0
    assert limits.max_items_per_request == 16
    assert limits.remote_fetch_timeout_s == 10
    assert limits.allow_remote is False


def test_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        MediaLimits().max_bytes = 1  # type: ignore[misc]


def test_max_items_per_request() -> None:
    limits = MediaLimits(max_items_per_request=2)
    limits.check_num_items(2, "messages")
    with pytest.raises(MediaError) as e:
        limits.check_num_items(3, "messages")
    assert e.value.param == "messages"
    assert "max_items_per_request" in e.value.message
