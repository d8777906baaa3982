"""Whisper's log-mel features for the audio encoders: the mel filter bank, the features and
their valid frames per 30 s window against transformers, and what is not a clip refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from gpu_workers.preprocess.audio import AudioFeatureConfig, LogMelExtractor, mel_filter_bank

SR = 16000


def noise(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # a tone plus noise, so the spectrum is not flat and the dynamic-range clamp bites
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def extractor() -> LogMelExtractor:
    return LogMelExtractor(AudioFeatureConfig(num_mel_bins=128))


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    # 3 s; 31 s (a full window and a 1 s tail); 0.5 s + 3 samples (ragged last frame)
    return [noise(3.0, 0), noise(31.0, 1), noise(0.5 + 3 / SR, 2)]


@pytest.mark.parametrize("num_mel_bins", [80, 128])
def test_mel_filter_bank_matches_transformers(num_mel_bins: int) -> None:
    from transformers.audio_utils import mel_filter_bank as hf_mel_filter_bank

    want = hf_mel_filter_bank(
        num_frequency_bins=201,
        num_mel_filters=num_mel_bins,
        min_frequency=0.0,
        max_frequency=8000.0,
        sampling_rate=SR,
        norm="slaney",
        mel_scale="slaney",
    )
    np.testing.assert_array_equal(mel_filter_bank(num_mel_bins, 400, SR), want)


def test_features_match_whisper_extractor(extractor: LogMelExtractor, clips: list[np.ndarray]) -> None:
    hf = WhisperFeatureExtractor(feature_size=128, sampling_rate=SR)
    got = extractor(clips)
    assert got.windows_per_clip == [1, 2, 1]
    assert got.features.shape == (4, 128, 3000)
    assert got.valid_frames.tolist() == [300, 3000, 100, 51]

    # transformers truncates the 31 s clip at 30 s: that is our first window of it; the tail
    # window is transformers on the last second alone
    tail = clips[1][30 * SR :]
    for hf_clips, rows in (([clips[0], clips[1], clips[2]], [0, 1, 3]), ([tail], [2])):
        want = hf(hf_clips, sampling_rate=SR, return_attention_mask=True, padding="max_length", return_tensors="pt")
        torch.testing.assert_close(got.features[rows], want["input_features"], rtol=0, atol=1e-4)
        assert got.valid_frames[rows].tolist() == want["attention_mask"].sum(-1).tolist()


def test_split_rejects_empty(extractor: LogMelExtractor) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        extractor([np.zeros(0, np.float32)])
    with pytest.raises(ValueError, match="1-D"):
        extractor([np.zeros((2, 100), np.float32)])


def test_a_window_s_valid_frames_are_its_samples_over_the_hop() -> None:
    config = AudioFeatureConfig(num_mel_bins=80)
    assert (config.samples_per_window, config.frames_per_window) == (480_000, 3000)
    assert [config.num_valid_frames(n) for n in (1, 159, 160, 161, 480_000)] == [1, 1, 1, 2, 3000]
    with pytest.raises(ValueError, match="sizes must be positive"):
        AudioFeatureConfig(hop_length=0)
    with pytest.raises(ValueError, match="a window must be a whole number of hops"):
        AudioFeatureConfig(hop_length=7)  # 480,000 samples are not whole hops of 7
