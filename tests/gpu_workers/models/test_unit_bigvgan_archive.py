"""The published audio decoder's archives (TorchServe .mar zips): reading one, folding weight
norm bit for bit as torch's weight_norm computes it (both APIs, Conv1d and ConvTranspose1d,
whose dim 0 is the input channel), loading either parametrization's names, and a directory
serving the generators its archives hold."""

from __future__ import annotations

import json
import types
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations
from torch.nn.utils import weight_norm as old_weight_norm

from gpu_workers.models.unit_bigvgan import NAMED_VOICES_ARCHIVE, ZERO_SHOT_ARCHIVE, UnitBigVganConfig
from gpu_workers.models.unit_bigvgan_archive import (
    fold_weight_norm,
    is_published_audio_decoder,
    load_generator,
    load_published_audio_decoder,
    read_archive,
)
from gpu_workers.tiny.published_audio_decoder import make_tiny_published_audio_decoder

# the generators' unit vocabulary (without bigvgan's package, which test_unit_bigvgan.py needs)
NUM_UNITS = 64


@pytest.fixture
def ecapa_module() -> types.ModuleType:
    from gpu_workers.models import ecapa_tdnn

    return ecapa_tdnn


@pytest.mark.parametrize("kind", ["conv", "deconv"])
@pytest.mark.parametrize("api", ["weight_g", "parametrizations"])
def test_weight_norm_folding_is_exact(kind: str, api: str) -> None:
    torch.manual_seed(7)
    layer = nn.Conv1d(6, 4, 5) if kind == "conv" else nn.ConvTranspose1d(6, 4, 8, stride=4)
    layer = old_weight_norm(layer) if api == "weight_g" else parametrizations.weight_norm(layer)
    with torch.no_grad():
        for _, p in layer.named_parameters():
            p.copy_(torch.randn(p.shape))
    x = torch.randn(1, 6, 9)
    with torch.no_grad():
        want_out = layer(x)  # the old API computes .weight in a pre-forward hook
        want = layer.weight.detach().clone()
    state = {f"m.deconv.{n}" if kind == "deconv" else f"m.conv.{n}": t for n, t in layer.state_dict().items()}
    folded = fold_weight_norm(state)
    name = f"m.{kind}.weight"
    assert set(folded) == {name, f"m.{kind}.bias"}
    assert torch.equal(folded[name], want)  # bit for bit
    op = F.conv1d if kind == "conv" else lambda x, w, b: F.conv_transpose1d(x, w, b, stride=4)
    assert torch.equal(op(x, folded[name], folded[f"m.{kind}.bias"]), want_out)
    # one norm per dim-0 row: the output channels of a conv (4), the INPUT ones of a deconv (6)
    g = state[f"m.{kind}." + ("weight_g" if api == "weight_g" else "parametrizations.weight.original0")]
    assert g.shape == ((4, 1, 1) if kind == "conv" else (6, 1, 1))


def test_tiny_archives_load_both_generators(tmp_path: Path, ecapa_module: types.ModuleType) -> None:
    directory = make_tiny_published_audio_decoder(tmp_path, seed=0, num_units=NUM_UNITS, voices=("fkms", "mhwj"))
    assert is_published_audio_decoder(directory)
    decoder = load_published_audio_decoder(directory)
    assert decoder.voices == ("fkms", "mhwj")
    assert decoder.named is not None and decoder.zero_shot is not None
    assert decoder.config.hop == 960 and decoder.config.num_units == NUM_UNITS
    assert decoder.zero_shot.generator.spk_emb is None and decoder.zero_shot.sample_rate == 24000
    mel = ecapa_module.reference_mel(torch.randn(24000).numpy(), 24000, decoder.zero_shot.mel_config)
    with torch.no_grad():
        vector = decoder.zero_shot.encoder(torch.as_tensor(mel))
        audio = decoder.zero_shot.generator(torch.tensor([[1, 2, 3]]), vector)
    assert vector.shape == (1, 16) and audio.shape == (1, 3 * 960)


def test_parametrization_names_load_the_same_weights(tmp_path: Path, ecapa_module: types.ModuleType) -> None:
    directory = make_tiny_published_audio_decoder(tmp_path, seed=0, num_units=NUM_UNITS, voices=("a", "b"))
    archive = read_archive(directory / NAMED_VOICES_ARCHIVE)
    assert any(n.endswith(".weight_g") for n in archive.generator)
    renamed = {
        n.replace(".weight_g", ".parametrizations.weight.original0").replace(".weight_v", ".parametrizations.weight.original1"): t
        for n, t in archive.generator.items()
    }
    config = UnitBigVganConfig.from_reference(archive.config)
    a, b = load_generator(config, archive.generator, "g"), load_generator(config, renamed, "p")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_a_wrong_stored_filter_is_refused(tmp_path: Path, ecapa_module: types.ModuleType) -> None:
    directory = make_tiny_published_audio_decoder(tmp_path, seed=0, num_units=NUM_UNITS, voices=("a",))
    archive = read_archive(directory / NAMED_VOICES_ARCHIVE)
    config = UnitBigVganConfig.from_reference(archive.config)
    state = dict(archive.generator)
    state["activation_post.upsample.filter"] = state["activation_post.upsample.filter"].flip(-1) * 1.1
    with pytest.raises(ValueError, match="Kaiser-sinc"):
        load_generator(config, state, "g")


def test_one_archive_serves_what_it_has(tmp_path: Path, ecapa_module: types.ModuleType) -> None:
    directory = make_tiny_published_audio_decoder(tmp_path, seed=0, num_units=NUM_UNITS, voices=("a",))
    (directory / ZERO_SHOT_ARCHIVE).unlink()
    decoder = load_published_audio_decoder(directory)
    assert decoder.zero_shot is None and decoder.voices == ("a",)
    make_tiny_published_audio_decoder(tmp_path, seed=0, num_units=NUM_UNITS, voices=("a",))
    (directory / NAMED_VOICES_ARCHIVE).unlink()
    decoder = load_published_audio_decoder(directory)
    assert decoder.named is None and decoder.voices == () and decoder.zero_shot is not None


def test_archive_without_a_serialized_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / NAMED_VOICES_ARCHIVE
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"serializedFile": "missing.pt"}}))
        mar.writestr("config.json", "{}")
    with pytest.raises(ValueError, match="serialized file"):
        read_archive(path)
