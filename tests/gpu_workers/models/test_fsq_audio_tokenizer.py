"""FSQ against a brute-force nearest grid point, and the tiny random audio tokenizer end to end."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_workers.models.fsq_audio_tokenizer import (
    FSQAudioTokenizer,
    FSQAudioTokenizerConfig,
    fsq_codes_to_levels,
    fsq_quantize,
    make_tiny_audio_tokenizer,
)
from gpu_workers.models.qwen2_audio_encoder import output_lengths
from gpu_workers.preprocess.audio import LogMelExtractor

SR = 16000


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """A voiced-sounding clip: a gliding pitch with one overtone, a syllable-rate envelope and
    a little noise, so the spectrum changes over time and differs between seeds."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    pitch = 150 + 100 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t)
    phase = 2 * np.pi * np.cumsum(pitch) / SR
    envelope = 0.5 * (1 + np.sin(2 * np.pi * rng.uniform(2, 5) * t + rng.uniform(0, 2 * np.pi)))
    x = 0.3 * envelope * (np.sin(phase) + 0.5 * np.sin(3 * phase)) + 0.02 * rng.standard_normal(t.size)
    return x.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# FSQ


def grid_points(levels: tuple[int, ...]) -> torch.Tensor:
    """(prod(levels), D) every grid point, row k being unit k: itertools.product varies its
    last factor fastest, so over the reversed dimensions dimension 0 varies fastest."""
    halves = [(n - 1) // 2 for n in levels]
    ranges = [range(-h, h + 1) for h in reversed(halves)]
    return torch.tensor([p[::-1] for p in itertools.product(*ranges)], dtype=torch.long)


@pytest.mark.parametrize("levels", [(3, 3, 3), (5, 3)])
def test_fsq_is_nearest_grid_point(levels: tuple[int, ...]) -> None:
    grid = grid_points(levels)  # (U, D)
    z = 2.0 * torch.randn(7, 60, len(levels), generator=torch.Generator().manual_seed(0))
    target = torch.tanh(z.double()) * torch.tensor([(n - 1) / 2 for n in levels], dtype=torch.float64)
    distance = ((target[..., None, :] - grid.double()) ** 2).sum(-1)  # (7, 60, U)
    want = distance.argmin(-1)  # (7, 60)

    units = fsq_quantize(z, levels)
    assert units.dtype == torch.long and units.shape == (7, 60)
    assert torch.equal(units, want)
    assert set(units.unique().tolist()) == set(range(math.prod(levels)))  # every unit is reached
    assert torch.equal(fsq_codes_to_levels(units, levels), grid[want])
    assert torch.equal(fsq_codes_to_levels(torch.arange(len(grid)), levels), grid)


def test_fsq_index_arithmetic() -> None:
    # unit = (q0 + 1) + 3 (q1 + 1) + 9 (q2 + 1) for levels (3, 3, 3)
    big = 10.0
    z = torch.tensor([[-big, -big, -big], [0.0, 0.0, 0.0], [big, big, big], [big, -big, 0.0], [-big, 0.0, big]])
    assert fsq_quantize(z, (3, 3, 3)).tolist() == [0, 13, 26, 2 + 0 + 9, 21]
    # (5, 3): tanh(0.6) * 2 = 1.07 -> 1; unit = (q0 + 2) + 5 (q1 + 1)
    assert fsq_quantize(torch.tensor([[0.6, big], [-big, -big]]), (5, 3)).tolist() == [3 + 10, 0]


def test_fsq_rejects_bad_levels() -> None:
    z = torch.zeros(2, 2)
    for levels in [(4, 3), (3, 2), (3, 1)]:
        with pytest.raises(ValueError, match="odd integers >= 3"):
            fsq_quantize(z, levels)
    with pytest.raises(ValueError, match="3 dims"):
        fsq_quantize(torch.zeros(2, 3), (3, 3))
    with pytest.raises(ValueError, match=r"\[0, 9\)"):
        fsq_codes_to_levels(torch.tensor([9]), (3, 3))
    encoder = {"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64}
    raw = {"model_type": "fsq_audio_tokenizer", "encoder_config": encoder, "levels": [3, 8]}
    with pytest.raises(ValueError, match="even count"):
        FSQAudioTokenizerConfig.from_hf(raw)
    assert FSQAudioTokenizerConfig.from_hf({**raw, "levels": [3] * 8}).num_units == 6561
    with pytest.raises(ValueError, match="projector"):
        with_projector = {**encoder, "projector_hidden_size": 8}
        FSQAudioTokenizerConfig.from_hf({**raw, "levels": [3], "encoder_config": with_projector})


# ---------------------------------------------------------------------------------------------
# The tiny tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_audio_tokenizer(tmp_path_factory.mktemp("fsq-a"))


@pytest.fixture(scope="module")
def tokenizer(checkpoint: Path) -> FSQAudioTokenizer:
    return FSQAudioTokenizer.from_dir(checkpoint)


def test_tiny_checkpoint_is_reproducible(checkpoint: Path, tmp_path: Path) -> None:
    again = make_tiny_audio_tokenizer(tmp_path / "b")
    other = make_tiny_audio_tokenizer(tmp_path / "c", seed=1)
    for name in ("config.json", "model.safetensors"):
        assert (checkpoint / name).read_bytes() == (again / name).read_bytes()
    assert (checkpoint / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()


def test_two_seconds_give_fifty_units(tokenizer: FSQAudioTokenizer) -> None:
    assert tokenizer.config.num_units == 81
    # 32000 samples -> ceil(32000 / 160) = 200 valid mel frames -> conv2 rows (200 - 1) // 2 + 1
    # = 100 -> average pool 100 // 2 = 50 units
    conv_rows, num_tokens = output_lengths(torch.tensor([200]))
    assert (conv_rows.item(), num_tokens.item()) == (100, 50)
    (units,) = tokenizer.encode([speechlike(2.0, 0)])
    assert len(units) == 50
    assert all(0 <= u < 81 for u in units)
    # the tiny weights are scaled so that units follow the audio (see make_tiny_audio_tokenizer)
    assert len(set(units)) >= 5
    assert sum(a != b for a, b in zip(units, units[1:])) >= 15


def test_batch_equals_one_at_a_time(tokenizer: FSQAudioTokenizer) -> None:
    clips = [speechlike(2.0, 1), speechlike(0.7, 2), speechlike(3.3, 3)]
    batch = tokenizer.encode(clips)
    assert [len(u) for u in batch] == [50, 17, 82]  # 200, 70, 330 frames -> 100, 35, 165 rows
    assert batch == [tokenizer.encode([clip])[0] for clip in clips]


def test_long_clip_is_its_windows_concatenated(tokenizer: FSQAudioTokenizer) -> None:
    clip = speechlike(40.0, 4)
    (units,) = tokenizer.encode([clip])
    first, second = tokenizer.encode([clip[: 30 * SR], clip[30 * SR :]])
    assert (len(first), len(second)) == (750, 250)  # 3000 frames -> 750; 1000 frames -> 250
    assert units == first + second


def test_different_clips_give_different_units(tokenizer: FSQAudioTokenizer) -> None:
    a, b = tokenizer.encode([speechlike(2.0, 5), speechlike(2.0, 6)])
    assert len(a) == len(b) == 50
    assert sum(x != y for x, y in zip(a, b)) >= 15


def test_forward_and_bf16_encoder(tokenizer: FSQAudioTokenizer, checkpoint: Path) -> None:
    features = LogMelExtractor(tokenizer.config.feature_config)([speechlike(1.0, 7), speechlike(2.0, 7)])
    with torch.no_grad():
        units, num_tokens = tokenizer(features.features, features.valid_frames)
    assert num_tokens == [25, 50] and units.shape == (75,) and units.dtype == torch.long

    half = FSQAudioTokenizer.from_dir(checkpoint, dtype=torch.bfloat16)
    assert half.encoder.conv1.weight.dtype == torch.bfloat16
    assert half.fsq_proj.weight.dtype == torch.float32  # z is quantised in float32
    (got,) = half.encode([speechlike(1.0, 7)])
    assert len(got) == 25 and all(0 <= u < 81 for u in got)
