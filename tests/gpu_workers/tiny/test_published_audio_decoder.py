"""The tiny published decoder/audio/: two .mar zips in the reference's layout, the same bytes
for the same arguments, the real hop (960 samples a unit at 24 kHz)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import torch

from gpu_workers.models.unit_bigvgan import NAMED_VOICES_ARCHIVE, ZERO_SHOT_ARCHIVE, UnitBigVganConfig
from gpu_workers.tiny.published_audio_decoder import make_tiny_published_audio_decoder


def test_archives_are_reproducible_and_in_the_reference_layout(tmp_path: Path) -> None:
    a = make_tiny_published_audio_decoder(tmp_path / "a", seed=3, num_units=50, voices=("fkms", "mhwj"))
    b = make_tiny_published_audio_decoder(tmp_path / "b", seed=3, num_units=50, voices=("fkms", "mhwj"))
    for name in (NAMED_VOICES_ARCHIVE, ZERO_SHOT_ARCHIVE):
        assert (a / name).read_bytes() == (b / name).read_bytes()
        with zipfile.ZipFile(a / name) as mar:
            serialized = json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]["serializedFile"]
            config = UnitBigVganConfig.from_reference(json.loads(mar.read("config.json")))
            assert config.hop == 960 and config.num_units == 50
            state = torch.load(mar.open(serialized), weights_only=True)["generator"]
            assert "conv_pre.conv.weight_g" in state and "ups.0.0.deconv.weight_v" in state
            assert state["ups.0.0.deconv.weight_g"].shape == (64, 1, 1)  # dim 0: the input channels
            if name == NAMED_VOICES_ARCHIVE:
                assert mar.read("spk_list.txt").decode().splitlines() == ["fkms", "mhwj"]
                assert state["spk_emb.weight"].shape == (2, 16)
            else:
                assert "spk_list.txt" not in mar.namelist() and any(k.startswith("spk_emb.") for k in state)
