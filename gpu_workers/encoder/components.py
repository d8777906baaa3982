"""The encoders an encoder worker hosts: one Component subclass per component.

    vision_encoder   image, video -> embeddings   Qwen2.5-VL ViT + projector
    audio_encoder    audio -> embeddings          Qwen2-Audio encoder + projector
    image_tokenizer  image -> codes               TA-Tok (SigLIP features, nearest code)
    audio_tokenizer  audio -> units               S3TokenizerV2 (CosyVoice2), or the older FSQ tokenizer

Each reads its config and tensors through ComponentFiles (gpu_workers/encoder/component_files.py): a
component directory, or its part of the published checkpoint. prepare() runs per item on decoded media (a ValueError there is the client's 400); forward()
runs once over every prepared item of a batch. gpu_workers/encoder/runner.py drives them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image

from gpu_workers.encoder.component_files import ComponentFiles, DirFiles
from gpu_workers.models.fsq_audio_tokenizer import FSQAudioTokenizer
from gpu_workers.models.qwen2_5_vl_vision import Qwen2_5_VisionEncoder, VisionEncoderConfig
from gpu_workers.models.qwen2_audio_encoder import AudioEncoderConfig, Qwen2AudioEncoder
from gpu_workers.models.s3_tokenizer import MIN_PIECE_SAMPLES, S3TokenizerV2
from gpu_workers.models.s3_tokenizer import MODEL_TYPE as S3_TOKENIZER_V2
from gpu_workers.models.ta_tok import TATokImageTokenizer
from gpu_workers.preprocess.audio import AudioFeatureConfig, LogMelExtractor
from gpu_workers.preprocess.image import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    ImageProcessingConfig,
    ImageProcessor,
    patchify,
    smart_resize,
    to_rgb,
)

COMPONENTS = ("vision_encoder", "audio_encoder", "image_tokenizer", "audio_tokenizer")


def _triple(value: Any) -> tuple[float, float, float]:
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise ValueError(f"preprocessor_config.json: want three per-channel values, got {value!r}")
    return float(value[0]), float(value[1]), float(value[2])


@dataclass(frozen=True, slots=True)
class VideoConfig:
    """How a video becomes vision-tower input (the reference model's values by default)."""

    max_pixels_per_frame: int = 378 * 378
    min_frames: int = 4
    frames_per_chunk: int = 32  # frames per grid item, bounding one attention segment's size


# ---------------------------------------------------------------------------------------------
# Components


class Component(ABC):
    """One encoder. prepare() runs per item (a ValueError there is the client's fault);
    forward() runs once over every prepared item of a batch."""

    name: ClassVar[str]
    kinds: ClassVar[frozenset[str]]
    discrete: ClassVar[bool]
    _registry: ClassVar[dict[str, type[Component]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # a concrete component, not a shared base
            Component._registry[cls.name] = cls

    def __init__(self, files: ComponentFiles, device: torch.device, dtype: torch.dtype) -> None:
        self.files = files
        self.device = device
        self.dtype = dtype

    @classmethod
    def create(cls, name: str, files: ComponentFiles, device: torch.device, dtype: torch.dtype) -> Component:
        return cls._registry[name](files, device, dtype)

    @abstractmethod
    def prepare(self, kind: str, media: Any) -> Any: ...

    @abstractmethod
    def forward(self, prepared: list[Any]) -> list[torch.Tensor]:
        """One output per item: (rows, hidden) embeddings, or (n,) int64 codes."""

    # One forward takes items up to this much cost (an item above it goes alone), so that a
    # batch's activations are bounded by its tokens or samples, not its item count (review A7).
    max_forward_cost: ClassVar[int] = 1 << 62

    def cost(self, prepared: Any) -> int:
        return 1

    def largest_forward(self) -> list[Any] | None:
        """Prepared items that cost max_forward_cost together (the profile run's), or None
        for a component whose forwards are small whatever the batch."""
        return None


def forward_groups(component: Component, prepared: list[Any]) -> list[list[int]]:
    """The indices of prepared items, in order, cut into runs of at most max_forward_cost."""
    groups: list[list[int]] = []
    total = 0
    for i, item in enumerate(prepared):
        cost = component.cost(item)
        if not groups or total + cost > component.max_forward_cost:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += cost
    return groups


class VisionEncoderComponent(Component):
    name = "vision_encoder"
    kinds = frozenset({"image", "video"})
    discrete = False

    def __init__(self, files: ComponentFiles, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(files, device, dtype)
        self.config = VisionEncoderConfig.from_hf(files.config())
        pre = files.side_json("preprocessor_config.json") or {}
        c = self.config
        self.processor = ImageProcessor(
            ImageProcessingConfig(
                patch_size=c.patch_size,
                temporal_patch_size=c.temporal_patch_size,
                merge_size=c.spatial_merge_size,
                min_pixels=int(pre.get("min_pixels", 3_136)),
                max_pixels=int(pre.get("max_pixels", 2_073_600)),
                image_mean=_triple(pre.get("image_mean", OPENAI_CLIP_MEAN)),
                image_std=_triple(pre.get("image_std", OPENAI_CLIP_STD)),
            )
        )
        default = VideoConfig()
        self.video = VideoConfig(
            max_pixels_per_frame=int(pre.get("video_max_pixels", default.max_pixels_per_frame)),
            min_frames=int(pre.get("video_min_frames", default.min_frames)),
            frames_per_chunk=int(pre.get("video_frames_per_chunk", default.frames_per_chunk)),
        )
        self.model = Qwen2_5_VisionEncoder(c)
        self.model.load_hf_state_dict(files.tensors())
        self.model.to(device=device, dtype=dtype).eval()

    # ViT patches (14x14 pixels each, before the 2x2 merge) of one forward: 64 images of
    # 1 Mpx, or 12 Mpx in all, where 32 images of 2 Mpx would be 340k
    max_forward_cost = 65536

    def cost(self, prepared: tuple[np.ndarray, list[tuple[int, int, int]]]) -> int:
        return int(prepared[0].shape[0])

    def largest_forward(self) -> list[Any]:
        """One still image of max_forward_cost patches: a square grid, sides a multiple of the merge."""
        c = self.config
        merge = c.spatial_merge_size
        side = max(merge, int(self.max_forward_cost**0.5) // merge * merge)
        return [(np.zeros((side * side, c.patch_dim), dtype=np.float32), [(1, side, side)])]

    def prepare(self, kind: str, media: Any) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
        """-> (patches (N, patch_dim), grid items); an image is one grid item, a video one per chunk."""
        p = self.processor.config
        if kind == "image":
            pixels, image_grid = self.processor.preprocess([media])
            t, h, w = (int(v) for v in image_grid[0].tolist())
            return pixels.numpy(), [(t, h, w)]
        frames: list[np.ndarray] = list(media)
        while len(frames) < max(self.video.min_frames, 1) or len(frames) % p.temporal_patch_size:
            frames.append(frames[-1])  # short clips repeat their last frame, as the reference pads
        height, width = frames[0].shape[:2]
        h, w = smart_resize(height, width, p.factor, p.min_pixels, min(p.max_pixels, self.video.max_pixels_per_frame))
        resized = [self._normalize_frame(f, h, w) for f in frames]
        stack = np.stack(resized)  # (T, C, H, W)
        tps = p.temporal_patch_size
        chunk = max(tps, self.video.frames_per_chunk - self.video.frames_per_chunk % tps)
        patches: list[np.ndarray] = []
        grids: list[tuple[int, int, int]] = []
        for start in range(0, len(frames), chunk):
            part = stack[start : start + chunk]
            patches.append(patchify(part, p.patch_size, p.temporal_patch_size, p.merge_size))
            grids.append((part.shape[0] // p.temporal_patch_size, h // p.patch_size, w // p.patch_size))
        return np.concatenate(patches), grids

    def _normalize_frame(self, frame: np.ndarray, h: int, w: int) -> np.ndarray:
        image = Image.fromarray(frame)
        if image.size != (w, h):
            image = image.resize((w, h), resample=Image.Resampling.BICUBIC)
        return self.processor.normalize(image)  # already (h, w): normalize only rescales

    def forward(self, prepared: list[tuple[np.ndarray, list[tuple[int, int, int]]]]) -> list[torch.Tensor]:
        pixels = torch.from_numpy(np.concatenate([p for p, _ in prepared])).to(self.device, self.dtype)
        grids = [g for _, item_grids in prepared for g in item_grids]
        out = self.model(pixels, torch.tensor(grids, dtype=torch.int64))  # (sum rows, hidden)
        merge = self.config.spatial_merge_size**2
        rows = [sum(t * h * w for t, h, w in item_grids) // merge for _, item_grids in prepared]
        return list(torch.split(out, rows))


class AudioComponent(Component):
    """A component that reads 16 kHz mono waveforms."""

    kinds = frozenset({"audio"})
    max_forward_cost = 16000 * 600  # 16 kHz samples: ten minutes of audio in one forward

    def cost(self, prepared: np.ndarray) -> int:
        return len(prepared)

    def largest_forward(self) -> list[Any]:
        return [np.zeros(self.max_forward_cost, dtype=np.float32)]

    def prepare(self, kind: str, media: Any) -> np.ndarray:
        if len(media) == 0:
            raise ValueError("the audio is empty")
        return np.asarray(media, dtype=np.float32)


class AudioEncoderComponent(AudioComponent):
    name = "audio_encoder"
    discrete = False

    def __init__(self, files: ComponentFiles, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(files, device, dtype)
        self.config = AudioEncoderConfig.from_hf(files.config())
        self.features = LogMelExtractor(AudioFeatureConfig(num_mel_bins=self.config.num_mel_bins), device)
        self.model = Qwen2AudioEncoder(self.config)
        self.model.load_hf_state_dict(files.tensors())
        self.model.to(device=device, dtype=dtype).eval()

    def forward(self, prepared: list[np.ndarray]) -> list[torch.Tensor]:
        feats = self.features(prepared)
        out, per_window = self.model(feats.features.to(self.dtype), feats.valid_frames)
        rows, start = [], 0
        for n in feats.windows_per_clip:  # a clip owns consecutive windows
            rows.append(sum(per_window[start : start + n]))
            start += n
        return list(torch.split(out, rows))


class ImageTokenizerComponent(Component):
    name = "image_tokenizer"
    kinds = frozenset({"image"})
    discrete = True

    def __init__(self, files: ComponentFiles, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(files, device, dtype)
        self.model = TATokImageTokenizer.from_weights(files.config(), files.tensors(), device=device, dtype=dtype)

    def prepare(self, kind: str, media: Any) -> Image.Image:
        return to_rgb(media)

    def forward(self, prepared: list[Image.Image]) -> list[torch.Tensor]:
        pixels = self.model.preprocess(prepared).to(self.device, self.dtype)
        return list(self.model(pixels))  # (B, num_codes) -> B rows


class AudioTokenizerComponent(AudioComponent):
    name = "audio_tokenizer"
    discrete = True

    def __init__(self, files: ComponentFiles, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(files, device, dtype)
        self.model: S3TokenizerV2 | FSQAudioTokenizer
        # {"model_type": "s3_tokenizer_v2"} (the published checkpoint's) takes its sizes from its
        # weights' shapes
        if files.config().get("model_type") == S3_TOKENIZER_V2:
            self.model = S3TokenizerV2.from_reference_state_dict(files.tensors(), device=device, dtype=dtype)
            self.min_samples = MIN_PIECE_SAMPLES
        else:
            assert isinstance(files, DirFiles), "the published audio tokenizer is S3TokenizerV2"
            self.model = FSQAudioTokenizer.from_dir(files.where, device=device, dtype=dtype)
            self.min_samples = 1

    def prepare(self, kind: str, media: Any) -> np.ndarray:
        wave = super().prepare(kind, media)
        if len(wave) < self.min_samples:  # here, so that it is the client's 400
            raise ValueError(f"the audio is too short for the audio tokenizer ({len(wave)} samples)")
        return wave

    def forward(self, prepared: list[np.ndarray]) -> list[torch.Tensor]:
        return [torch.as_tensor(np.asarray(units, dtype=np.int64)) for units in self.model.encode(prepared)]
