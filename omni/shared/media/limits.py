from __future__ import annotations

from dataclasses import dataclass

from omni.shared.media.errors import MediaError

_MIB = 1024 * 1024


@dataclass(frozen=True)
class MediaLimits:
    max_bytes: int = 20 * _MIB  # per item, encoded
    max_image_pixels: int = 7680 * 4320  # 8K, decoded width * height, checked before decoding
    max_audio_seconds: float = 600.0
    max_video_frames: int = 128  # after sampling at video_fps
    video_fps: float = 2.0
    max_items_per_request: int = 16
    remote_fetch_timeout_s: float = 10.0
    allow_remote: bool = False

    def check_num_items(self, num_items: int, param: str) -> None:
        if num_items > self.max_items_per_request:
            raise MediaError(
                f"{num_items} media items in one request; at most "
                f"{self.max_items_per_request} are allowed (max_items_per_request).",
                param=param,
            )
