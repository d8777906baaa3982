import io

import numpy as np
import pytest
from PIL import Image

from omni.shared.media.errors import MediaError
from omni.shared.media.limits import MediaLimits
from omni.shared.media.video import decode_video, is_video
from tests.omni.shared.media.conftest import png_bytes, wav_bytes

PARAM = "messages[0].content[2].video_url"


def _error(data: bytes, limits: MediaLimits = MediaLimits()) -> MediaError:
    with pytest.raises(MediaError) as e:
        decode_video(data, limits, PARAM)
    assert e.value.param == PARAM
    return e.value


@pytest.mark.parametrize("clip", ["mp4_video", "webm_video"])
def test_samples_2s_at_2fps(clip: str, request: pytest.FixtureRequest) -> None:
    frames, times = decode_video(request.getfixturevalue(clip), MediaLimits(), PARAM)
    assert 3 <= len(frames) <= 5
    assert len(times) == len(frames)
    assert times[:4] == pytest.approx([0.0, 0.5, 1.0, 1.5], abs=0.101)  # within one 10 fps frame
    for frame in frames:
        assert frame.shape == (16, 16, 3) and frame.dtype == np.uint8
    # Frame i of the clip is filled with 10 * i: the samples at 0.5 s steps are 5 frames apart.
    assert abs(int(frames[1].mean()) - int(frames[0].mean()) - 50) <= 6


def test_higher_fps_samples_more(mp4_video: bytes) -> None:
    frames, times = decode_video(mp4_video, MediaLimits(video_fps=5.0), PARAM)
    assert len(frames) == 10
    assert times == pytest.approx([0.2 * i for i in range(10)], abs=1e-6)


def test_fps_above_source_keeps_every_frame(mp4_video: bytes) -> None:
    frames, _ = decode_video(mp4_video, MediaLimits(video_fps=100.0), PARAM)
    assert len(frames) == 20


def test_max_frames_spreads_evenly(mp4_video: bytes) -> None:
    frames, times = decode_video(mp4_video, MediaLimits(video_fps=10.0, max_video_frames=3), PARAM)
    assert 1 <= len(frames) <= 3
    assert times[0] == 0.0 and times[-1] >= 1.0  # spans the clip, not just its start


def test_single_frame_limit(mp4_video: bytes) -> None:
    frames, times = decode_video(mp4_video, MediaLimits(max_video_frames=1), PARAM)
    assert len(frames) == 1 and times == [0.0]


def test_pixel_limit(mp4_video: bytes) -> None:
    assert "max_image_pixels" in _error(mp4_video, MediaLimits(max_image_pixels=255)).message


def test_byte_limit(mp4_video: bytes) -> None:
    assert "max_bytes" in _error(mp4_video, MediaLimits(max_bytes=len(mp4_video) - 1)).message


def test_corrupt_video(mp4_video: bytes) -> None:
    for data in (b"", b"junk" * 50, mp4_video[: len(mp4_video) // 3], mp4_video[:64]):
        assert _error(data).message.startswith(f"could not decode video in {PARAM}")


def test_audio_only_is_400() -> None:
    assert _error(wav_bytes(0.2)).message.startswith("could not decode video")


def test_is_video(mp4_video: bytes, webm_video: bytes) -> None:
    assert is_video(mp4_video) and is_video(webm_video)
    assert is_video(b"\x00\x00\x00\x14ftypqt  \x00\x00\x00\x00")  # QuickTime .mov
    assert not is_video(png_bytes())
    assert not is_video(wav_bytes(0.1))
    assert not is_video(b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00")  # AVIF still image
    assert not is_video(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00")
    assert not is_video(b"")
    buf = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buf, format="GIF")
    assert not is_video(buf.getvalue())
