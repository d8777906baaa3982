"""Whisper-style log-mel features for the Qwen2-Audio encoder, computed in torch.

The same numbers as transformers' WhisperFeatureExtractor (its torch path), without needing
transformers at run time. Per 30 s window of 16 kHz audio:

    waveform (480000,), zero-padded past the clip
      -> STFT (n_fft 400, hop 160, Hann, centred with reflect padding) -> 3001 frames, the
         last one dropped -> power spectrum (201, 3000)
      -> Slaney mel filter bank (n_mels, 201) -> log10(max(., 1e-10))
      -> max(x, window max - 8) -> (x + 4) / 4                       (n_mels, 3000)

WhisperFeatureExtractor truncates at 30 s; here a longer clip is cut into consecutive 30 s
windows, each treated exactly as WhisperFeatureExtractor treats a clip of that length (its
own padding, its own dynamic-range max), so the first window of a long clip equals what
transformers computes for the whole clip. Valid frames of a window of n samples:

    ceil(n / hop)        sample s lies in frames [s // hop ...]; frame f is centred on f*hop
    = 3000 for a full window, 300 for 3 s, 1 for a window of 1..160 samples

which is transformers' attention_mask.sum(-1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

_LOG_FLOOR = 1e-10  # power floor before log10, as Whisper
_DYNAMIC_RANGE = 8.0  # log10 units kept below each window's max


@dataclass(frozen=True, slots=True)
class AudioFeatureConfig:
    num_mel_bins: int = 128  # 80 for Whisper v1-v2, 128 for Qwen2-Audio and Whisper v3
    sampling_rate: int = 16000
    n_fft: int = 400
    hop_length: int = 160
    window_seconds: int = 30

    def __post_init__(self) -> None:
        if self.num_mel_bins <= 0 or self.n_fft <= 0 or self.hop_length <= 0:
            raise ValueError(f"audio features: sizes must be positive, got {self}")
        if self.samples_per_window % self.hop_length:
            raise ValueError("audio features: a window must be a whole number of hops")

    @property
    def samples_per_window(self) -> int:
        return self.window_seconds * self.sampling_rate

    @property
    def frames_per_window(self) -> int:
        return self.samples_per_window // self.hop_length

    def num_valid_frames(self, num_samples: int) -> int:
        """Valid frames of a window holding num_samples real samples (1..samples_per_window)."""
        return -(-num_samples // self.hop_length)


@dataclass(frozen=True, slots=True)
class AudioFeatures:
    """A batch of clips cut into windows.

    features: (num_windows, n_mels, frames_per_window), windows of clip 0, then clip 1, ...
    valid_frames: (num_windows,) int64, frames [0, valid) of each window are audio
    windows_per_clip: how many consecutive windows each clip owns
    """

    features: torch.Tensor
    valid_frames: torch.Tensor
    windows_per_clip: list[int]

    @property
    def num_windows(self) -> int:
        return self.features.shape[0]


def _hertz_to_mel(freq: np.ndarray) -> np.ndarray:
    # Slaney: linear below 1 kHz (3 mels per 200 Hz), logarithmic above
    mels = 3.0 * freq / 200.0
    log_region = freq >= 1000.0
    mels[log_region] = 15.0 + np.log(freq[log_region] / 1000.0) * (27.0 / np.log(6.4))
    return mels


def _mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    freq = 200.0 * mels / 3.0
    log_region = mels >= 15.0
    freq[log_region] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mels[log_region] - 15.0))
    return freq


def mel_filter_bank(num_mel_bins: int, n_fft: int, sampling_rate: int, max_frequency: float = 8000.0) -> np.ndarray:
    """(n_fft // 2 + 1, num_mel_bins) float64 Slaney-scale, Slaney-normalised triangles over
    0 .. max_frequency Hz: transformers.audio_utils.mel_filter_bank(min_frequency=0,
    max_frequency=8000, norm="slaney", mel_scale="slaney") as WhisperFeatureExtractor calls it."""
    num_bins = n_fft // 2 + 1
    mel_edges = np.linspace(0.0, _hertz_to_mel(np.array([max_frequency]))[0], num_mel_bins + 2)
    edges = _mel_to_hertz(mel_edges)  # (M+2,) Hz: filter m rises on [m, m+1], falls on [m+1, m+2]
    fft_freqs = np.linspace(0, sampling_rate // 2, num_bins)
    slopes = edges[None, :] - fft_freqs[:, None]  # (F, M+2)
    widths = np.diff(edges)  # (M+1,)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))  # (F, M)
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]  # equal area per filter


class LogMelExtractor:
    """Holds the window and filter bank (built once) and turns clips into 30 s windows."""

    def __init__(self, config: AudioFeatureConfig, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.device = torch.device(device)
        self.window = torch.hann_window(config.n_fft, device=self.device)
        filters = mel_filter_bank(config.num_mel_bins, config.n_fft, config.sampling_rate)
        self.mel_filters = torch.from_numpy(filters.T.copy()).to(self.device, torch.float32)  # (M, F)

    def split(self, waveform: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
        """A 1-D clip -> its 30 s pieces (the last one shorter) and each piece's valid frames."""
        if waveform.dim() != 1 or waveform.numel() == 0:
            raise ValueError(f"audio clip must be a non-empty 1-D waveform, got shape {tuple(waveform.shape)}")
        pieces = list(torch.split(waveform, self.config.samples_per_window))
        return pieces, [self.config.num_valid_frames(p.numel()) for p in pieces]

    def log_mel(self, windows: torch.Tensor) -> torch.Tensor:
        """(W, samples_per_window) float32 waveforms -> (W, n_mels, frames_per_window)."""
        c = self.config
        stft = torch.stft(windows, c.n_fft, c.hop_length, window=self.window, return_complex=True)  # (W, F, T+1)
        power = (stft[..., :-1].abs() ** 2).contiguous()  # (W, F, T); contiguous keeps the matmul fast
        mel = self.mel_filters @ power  # (W, M, T)
        log_spec = torch.clamp(mel, min=_LOG_FLOOR).log10()
        peak = log_spec.amax(dim=(1, 2), keepdim=True)  # (W, 1, 1): each window its own range
        log_spec = torch.maximum(log_spec, peak - _DYNAMIC_RANGE)
        return (log_spec + 4.0) / 4.0

    def __call__(self, clips: Sequence[torch.Tensor | np.ndarray]) -> AudioFeatures:
        """Mono clips at config.sampling_rate -> every clip's windows, batched."""
        if not clips:
            raise ValueError("no audio clips")
        pieces: list[torch.Tensor] = []
        valid: list[int] = []
        per_clip: list[int] = []
        for clip in clips:
            wave = torch.as_tensor(clip).to(self.device, torch.float32)
            clip_pieces, clip_valid = self.split(wave)
            pieces += clip_pieces
            valid += clip_valid
            per_clip.append(len(clip_pieces))
        windows = torch.zeros(len(pieces), self.config.samples_per_window, device=self.device)
        for i, piece in enumerate(pieces):
            windows[i, : piece.numel()] = piece  # zeros past the clip: Whisper pads with silence
        return AudioFeatures(
            features=self.log_mel(windows),
            valid_frames=torch.tensor(valid, dtype=torch.long, device=self.device),
            windows_per_clip=per_clip,
        )
