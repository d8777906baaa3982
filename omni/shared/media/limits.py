from __future__ import annotations

from dataclasses import dataclass

from omni.shared.media.errors import MediaError
from omni.shared.settings import setting

_MIB = 1024 * 1024


@dataclass(frozen=True)
class MediaLimits:
    max_bytes: int = setting(20 * _MIB, flag="--max-media-bytes", type="size", help="per item, encoded")
    # 8K, checked before decoding
    max_image_pixels: int = setting(7680 * 4320, help="decoded width x height per image")
    max_audio_seconds: float = setting(600.0)
    max_video_frames: int = setting(128, help="after sampling at --video-fps")
    video_fps: float = setting(2.0, help="video frames sampled per second")
    max_items_per_request: int = setting(16, flag="--max-media-items", help="per request")
    remote_fetch_timeout_s: float = setting(10.0, flag="--media-fetch-timeout")
    allow_remote: bool = setting(
        False,
        flag="--allow-remote-media",
        help="fetch http(s) media URLs (public addresses only); default: data: URLs only",
    )

    def check_num_items(self, num_items: int, param: str) -> None:
        if num_items > self.max_items_per_request:
            raise MediaError(
                f"{num_items} media items in one request; at most "
                f"{self.max_items_per_request} are allowed (max_items_per_request).",
                param=param,
            )
