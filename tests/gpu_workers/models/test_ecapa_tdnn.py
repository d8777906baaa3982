"""The zero-shot speaker encoder and its reference-recording mel, each against an independent
implementation.

ECAPA-TDNN: WeSpeaker's ECAPA_TDNN (PyPI wespeaker-unofficial 0.0.2, a packaging of
wenet-e2e/wespeaker; like the reference, adapted from lawlict/ECAPA-TDNN) with pooling_func
"ASTP" and emb_bn=True is the reference's network as a whole: layer1, three SE-Res2Blocks
(conv -> ReLU -> BN order, the last Res2Net group passed through, SE with a 128 bottleneck),
the 1x1 conv over cat(layer2..4) with ReLU, attentive statistics pooling with and without
global context, bn, linear and bn2 (= the reference's bn_out). Its differences, none of which
the reference has: its block convs carry biases (set to zero here, the reference's have none),
its tail is hard-wired to 512 * 3 channels (so at other widths the test gives it tails of the
right width built from its own ASTP, BatchNorm1d and Linear classes), and its pooling uses
1e-7 where the reference uses 1e-10 (global-context std) and 1e-9 (std clamp). The test's
random weights keep every pooled channel alive (see _live_channels), so the clamp never bites;
then in float64 the worst difference measured is 9e-16 without global context and 6e-9 with
it (the 1e-7 against 1e-10 under the square root), and 3e-6 for our float32 run, on outputs
up to about 3.

The mel: the Slaney filter bank against transformers' mel_filter_bank(norm="slaney",
mel_scale="slaney") (worst 9e-10, float32 storage); the whole log-mel against transformers'
numpy spectrogram() framing and rfft on our own reflect padding (worst 1.6e-5 on the log
values, where the mel is small); the 70 Hz high-pass against scipy's butter + sosfilt
(coefficients to 4e-16; output 3e-8 from scipy's float64, 1e-13 after both round to float32);
the resampler against scipy's resample_poly on band-limited audio away from the edges (worst
2.7e-4); and reference_mel end to end against scipy + numpy + transformers (worst 1.6e-6).

WeSpeaker's package __init__ imports its CLI (torchaudio, silero-vad, ...), so the test puts a
bare package module for `wespeaker` into sys.modules, pointing at the installed folder, and
imports only wespeaker.models.ecapa_tdnn and wespeaker.models.pooling_layers (torch only).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from scipy.signal import butter, resample_poly, sosfilt
from torch import nn
from transformers.audio_utils import mel_filter_bank, spectrogram, window_function

from gpu_workers.models.ecapa_tdnn import (
    EcapaConfig,
    EcapaTdnn,
    ReferenceMelConfig,
    highpass,
    highpass_coefficients,
    log_mel,
    normalise_level,
    random_reference_state_dict,
    reference_mel,
    resample,
    slaney_mel_filters,
)

VOCODER_CONFIG: dict[str, Any] = {  # the zero-shot .mar's keys, at toy sizes
    "num_mels": 40,
    "spk_hidden_dim": 64,
    "spk_emb_dim": 32,
    "global_context_att": True,
    "sampling_rate": 24000,
    "n_fft": 1024,
    "hop_size": 256,
    "win_size": 1024,
    "fmin": 0,
    "fmax": None,
}
_WESPEAKER_BLOCKS = {"Conv1dReluBn1": "0", "Res2Conv1dReluBn": "1", "Conv1dReluBn2": "2", "SE_Connect": "3"}


@pytest.fixture(scope="module")
def wespeaker() -> Iterator[tuple[types.ModuleType, types.ModuleType]]:
    spec = importlib.util.find_spec("wespeaker")
    assert spec is not None and spec.submodule_search_locations, "bin/setup test installs wespeaker-unofficial"
    saved = {name: mod for name, mod in sys.modules.items() if name == "wespeaker" or name.startswith("wespeaker.")}
    stub = types.ModuleType("wespeaker")
    stub.__path__ = list(spec.submodule_search_locations)
    sys.modules["wespeaker"] = stub
    try:
        yield (
            importlib.import_module("wespeaker.models.ecapa_tdnn"),
            importlib.import_module("wespeaker.models.pooling_layers"),
        )
    finally:
        for name in [n for n in sys.modules if n == "wespeaker" or n.startswith("wespeaker.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def _wespeaker_model(
    modules: tuple[types.ModuleType, types.ModuleType], config: EcapaConfig, sd: dict[str, torch.Tensor]
) -> nn.Module:
    ecapa, pooling = modules
    model = ecapa.ECAPA_TDNN(
        channels=config.channels,
        feat_dim=config.num_mels,
        embed_dim=config.embed_dim,
        pooling_func="ASTP",
        global_context_att=config.global_context_att,
        emb_bn=True,
    )
    wide = 3 * config.channels
    if wide != 512 * 3:  # its tail is hard-wired to 1536 channels: give it one of our width
        model.conv = nn.Conv1d(wide, wide, kernel_size=1)
        model.pool = pooling.ASTP(in_dim=wide, global_context_att=config.global_context_att)
        model.bn = nn.BatchNorm1d(2 * wide)
        model.linear = nn.Linear(2 * wide, config.embed_dim)
    mapped: dict[str, torch.Tensor] = {}
    for key, tensor in sd.items():
        parts = key.split(".")
        if parts[0] in ("layer2", "layer3", "layer4"):
            parts[1:2] = ["se_res2block", _WESPEAKER_BLOCKS[parts[1]]]
        parts[0] = {"pooling": "pool", "bn_out": "bn2"}.get(parts[0], parts[0])
        mapped[".".join(parts)] = tensor
    own = model.state_dict()
    extra_biases = sorted(set(own) - set(mapped))
    # the only entries the reference lacks: the biases WeSpeaker gives its block convs
    assert all(k.endswith("conv.bias") or (".convs." in k and k.endswith(".bias")) for k in extra_biases), extra_biases
    assert len(extra_biases) == 1 + 3 * (2 + 7)
    assert set(mapped) <= set(own)
    mapped.update({k: torch.zeros_like(own[k]) for k in extra_biases})
    model.load_state_dict(mapped, strict=True)
    return model.eval()


def _live_channels(config: EcapaConfig, sd: dict[str, torch.Tensor], mel: torch.Tensor) -> dict[str, torch.Tensor]:
    """Shift the 1x1 conv's biases so that each of its channels is positive on about half of
    mel's frames. With the raw random weights about a fifth of the channels are zero after
    the ReLU on every frame; their pooled std is then the clamp, sqrt(1e-9) in the reference
    and sqrt(1e-7) in WeSpeaker, a 3e-4 difference that says nothing about the network
    (test_pooled_std_of_a_dead_channel_is_the_reference_clamp checks ours)."""
    model = EcapaTdnn(config).double()
    model.load_reference_state_dict(sd)
    with torch.no_grad():
        out1 = model.layer1(mel)
        out2 = model.layer2(out1)
        out3 = model.layer3(out2)
        out4 = model.layer4(out3)
        pre = model.mfa(torch.cat((out2, out3, out4), dim=1))  # (B, 3C, T)
    median = pre.transpose(0, 1).reshape(pre.shape[1], -1).median(dim=1).values
    return {**sd, "conv.bias": (sd["conv.bias"].double() - median).float()}


def test_pooled_std_of_a_dead_channel_is_the_reference_clamp() -> None:
    config = EcapaConfig(num_mels=8, channels=8, embed_dim=4, global_context_att=True)
    model = EcapaTdnn(config)
    model.load_reference_state_dict(random_reference_state_dict(config, seed=0))
    x = torch.rand(2, 24, 10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[:, 5] = 0.0  # a channel the ReLU silenced on every frame
    with torch.no_grad():
        pooled = model.pooling.double()(x)  # (B, 2 * 24): means, then stds
    assert torch.equal(pooled[:, 5], torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(pooled[:, 24 + 5], torch.full((2,), 1e-9, dtype=torch.float64).sqrt(), rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    ("channels", "global_context_att", "tolerance"),
    [(512, False, 1e-12), (512, True, 1e-7), (64, False, 1e-12), (64, True, 1e-7)],
)
def test_speaker_encoder_matches_wespeaker(
    wespeaker: tuple[types.ModuleType, types.ModuleType], channels: int, global_context_att: bool, tolerance: float
) -> None:
    config = EcapaConfig(num_mels=40, channels=channels, embed_dim=48, global_context_att=global_context_att)
    mel = torch.randn(3, 40, 57, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 2 - 4
    sd = _live_channels(config, random_reference_state_dict(config, seed=channels + global_context_att), mel)
    ours = EcapaTdnn(config)
    ours.load_reference_state_dict(sd)
    theirs = _wespeaker_model(wespeaker, config, sd)
    with torch.no_grad():
        got = ours.double()(mel)
        _, want = theirs.double()(mel.transpose(1, 2))  # WeSpeaker takes (B, T, F)
    assert got.shape == (3, 48)
    assert want.abs().max() > 0.1  # a real signal, not collapsed by the random weights
    # measured: 9e-16 without global context; 6e-9 with it (its 1e-7 vs the reference's 1e-10)
    torch.testing.assert_close(got, want, rtol=0, atol=tolerance)
    # and in float32, as served
    with torch.no_grad():
        got32 = ours.float()(mel.float())
    torch.testing.assert_close(got32.double(), want, rtol=0, atol=1e-4)  # measured 3e-6


def test_speaker_encoder_ignores_its_training_flag() -> None:
    config = EcapaConfig.from_vocoder_config(VOCODER_CONFIG)
    model = EcapaTdnn(config)
    model.load_reference_state_dict(random_reference_state_dict(config, seed=3))
    mel = torch.randn(2, 40, 30, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eval_out = model.eval()(mel)
        train_out = model.train()(mel)  # running statistics all the same
    assert torch.equal(eval_out, train_out)
    # a batch of two is each row alone
    with torch.no_grad():
        torch.testing.assert_close(model(mel[1:]), eval_out[1:], rtol=1e-5, atol=1e-6)


def test_config_from_vocoder_json() -> None:
    assert EcapaConfig.from_vocoder_config(VOCODER_CONFIG) == EcapaConfig(40, 64, 32, True)
    mel = ReferenceMelConfig.from_vocoder_config({**VOCODER_CONFIG, "fmax": 8000})
    assert mel == ReferenceMelConfig(24000, 1024, 256, 1024, 40, 0.0, 8000.0)
    assert ReferenceMelConfig.from_vocoder_config(VOCODER_CONFIG).max_frequency == 12000.0
    for key in ("num_mels", "spk_hidden_dim", "spk_emb_dim", "global_context_att"):
        with pytest.raises(ValueError, match=key):
            EcapaConfig.from_vocoder_config({k: v for k, v in VOCODER_CONFIG.items() if k != key})
    for key in ("sampling_rate", "n_fft", "hop_size", "win_size", "fmin", "fmax"):
        with pytest.raises(ValueError, match=key):
            ReferenceMelConfig.from_vocoder_config({k: v for k, v in VOCODER_CONFIG.items() if k != key})
    with pytest.raises(ValueError, match="multiple of 8"):
        EcapaConfig.from_vocoder_config({**VOCODER_CONFIG, "spk_hidden_dim": 60})
    with pytest.raises(ValueError, match="fmax"):
        ReferenceMelConfig.from_vocoder_config({**VOCODER_CONFIG, "fmax": 13000})


def test_reference_names_and_shapes() -> None:
    """The names and shapes PUBLISHED_CHECKPOINT.md 5.4 lists for `spk_emb.*`."""
    c, e, m = 64, 32, 40
    sd = random_reference_state_dict(EcapaConfig(m, c, e, True), seed=1)
    shapes = {k: tuple(v.shape) for k, v in sd.items()}
    assert shapes["layer1.conv.weight"] == (c, m, 5)
    assert "layer1.conv.bias" not in shapes
    for layer in ("layer2", "layer3", "layer4"):
        assert shapes[f"{layer}.Conv1dReluBn1.conv.weight"] == (c, c, 1)
        assert shapes[f"{layer}.Conv1dReluBn2.bn.running_var"] == (c,)
        assert {k for k in shapes if k.startswith(f"{layer}.Res2Conv1dReluBn.convs.")} == {
            f"{layer}.Res2Conv1dReluBn.convs.{i}.weight" for i in range(7)
        }
        assert shapes[f"{layer}.Res2Conv1dReluBn.convs.6.weight"] == (c // 8, c // 8, 3)
        assert shapes[f"{layer}.Res2Conv1dReluBn.bns.6.num_batches_tracked"] == ()
        assert shapes[f"{layer}.SE_Connect.linear1.weight"] == (128, c)
        assert shapes[f"{layer}.SE_Connect.linear2.weight"] == (c, 128)
    assert shapes["conv.weight"] == (3 * c, 3 * c, 1) and "conv.bias" in shapes
    assert shapes["pooling.linear1.weight"] == (128, 9 * c, 1)
    assert shapes["pooling.linear2.weight"] == (3 * c, 128, 1)
    assert shapes["bn.running_mean"] == (6 * c,)
    assert shapes["linear.weight"] == (e, 6 * c)
    assert shapes["bn_out.weight"] == (e,)
    no_context = random_reference_state_dict(EcapaConfig(m, c, e, False), seed=1)
    assert no_context["pooling.linear1.weight"].shape == (128, 3 * c, 1)
    # deterministic, and the seed matters
    again = random_reference_state_dict(EcapaConfig(m, c, e, True), seed=1)
    assert all(torch.equal(sd[k], again[k]) for k in sd)
    other = random_reference_state_dict(EcapaConfig(m, c, e, True), seed=2)
    assert not torch.equal(sd["linear.weight"], other["linear.weight"])
    assert all(float(v.min()) > 0 for k, v in sd.items() if k.endswith("running_var"))


def test_load_reference_state_dict_is_strict() -> None:
    config = EcapaConfig(40, 64, 32, False)
    sd = random_reference_state_dict(config, seed=0)
    model = EcapaTdnn(config)
    # num_batches_tracked is accepted and not required
    model.load_reference_state_dict({k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")})
    model.load_reference_state_dict(sd)
    own = model.state_dict()
    assert torch.equal(own["layer3.res2.convs.2.weight"], sd["layer3.Res2Conv1dReluBn.convs.2.weight"])
    assert torch.equal(own["mfa.bias"], sd["conv.bias"])
    assert torch.equal(model.bn_out.running_var, sd["bn_out.running_var"])
    with pytest.raises(ValueError, match=r"missing \['layer2.SE_Connect.linear1.bias'\]"):
        model.load_reference_state_dict({k: v for k, v in sd.items() if k != "layer2.SE_Connect.linear1.bias"})
    with pytest.raises(ValueError, match="unexpected.*instance_norm.weight"):
        model.load_reference_state_dict({**sd, "instance_norm.weight": torch.ones(40)})
    with pytest.raises(ValueError, match="unexpected.*conv.num_batches_tracked"):
        model.load_reference_state_dict({**sd, "conv.num_batches_tracked": torch.tensor(0)})
    with pytest.raises(ValueError, match=r"linear.weight: shape \(32, 383\), want \(32, 384\)"):
        model.load_reference_state_dict({**sd, "linear.weight": torch.zeros(32, 383)})


def test_mel_filters_match_transformers() -> None:
    for fmin, fmax, sr, n_fft, mels in ((0.0, None, 24000, 1024, 100), (50.0, 7600.0, 22050, 1024, 80)):
        config = ReferenceMelConfig(sr, n_fft, 256, n_fft, mels, fmin, fmax)
        want = mel_filter_bank(
            num_frequency_bins=n_fft // 2 + 1,
            num_mel_filters=mels,
            min_frequency=fmin,
            max_frequency=config.max_frequency,
            sampling_rate=sr,
            norm="slaney",
            mel_scale="slaney",
        ).T
        got = slaney_mel_filters(config).numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-9)  # measured 9e-10 (float32 storage)


def _numpy_log_mel(samples: np.ndarray, config: ReferenceMelConfig) -> np.ndarray:
    """The reference's mel rebuilt from transformers' numpy STFT and filter bank."""
    padded = np.pad(samples.astype(np.float64), config.pad, mode="reflect")
    window = window_function(config.win_size, "hann", periodic=True, frame_length=config.n_fft, center=True)
    power = spectrogram(
        padded, window, frame_length=config.n_fft, hop_length=config.hop_size, power=2.0, center=False
    )  # (n_fft // 2 + 1, T)
    filters = mel_filter_bank(
        num_frequency_bins=config.n_fft // 2 + 1,
        num_mel_filters=config.num_mels,
        min_frequency=config.fmin,
        max_frequency=config.max_frequency,
        sampling_rate=config.sampling_rate,
        norm="slaney",
        mel_scale="slaney",
    )
    mel = filters.T @ np.sqrt(power + 1e-9)
    return np.log(np.maximum(mel, 1e-5))


def _speech_like(seconds: float, sr: int, seed: int) -> np.ndarray:
    """A hum below the high-pass, a voiced harmonic series, noise, and a DC offset."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    voiced = sum(np.sin(2 * np.pi * 140 * k * t + k) / k for k in range(1, 12))
    return (0.2 * voiced + 0.3 * np.sin(2 * np.pi * 30 * t) + 0.02 * rng.standard_normal(t.size) + 0.1).astype(
        np.float32
    )


@pytest.mark.parametrize("win_size", [1024, 800])
def test_log_mel_matches_numpy_stft(win_size: int) -> None:
    config = ReferenceMelConfig(24000, 1024, 256, win_size, 100, 0.0, None)
    samples = 0.3 * _speech_like(0.7, 24000, 0)
    got = log_mel(torch.from_numpy(samples).unsqueeze(0), config)[0].numpy()
    want = _numpy_log_mel(samples, config)
    assert got.shape == want.shape == (100, (samples.size + 2 * config.pad - 1024) // 256 + 1)
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-5)  # measured 1.6e-5


def test_highpass_matches_scipy() -> None:
    for sr in (16000, 22050, 24000, 44100, 48000):
        sos = butter(2, 70, "highpass", fs=sr, output="sos")
        b, a = highpass_coefficients(sr)
        np.testing.assert_allclose(np.concatenate([b, a]), sos[0], rtol=0, atol=1e-15)  # measured 4e-16
    samples = _speech_like(1.3, 24000, 1)  # 31200 samples: not a whole number of blocks
    got = highpass(samples, 24000)
    want = sosfilt(butter(2, 70, "highpass", fs=24000, output="sos"), samples).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)  # measured 1e-13 (float32 rounding)


def test_level_normalisation() -> None:
    quiet = (0.001 * _speech_like(0.5, 24000, 2)).astype(np.float32)
    out = normalise_level(quiet)
    assert out.dtype == np.float32
    assert 20 * np.log10(np.sqrt(np.mean(out.astype(np.float64) ** 2))) == pytest.approx(-26.0, abs=1e-4)
    spiky = np.zeros(24000, np.float32)
    spiky[::4000] = 0.5  # -26 dBFS RMS would need a peak of 4.9: the peak caps the gain
    out = normalise_level(spiky)
    assert float(np.max(np.abs(out))) == pytest.approx(1.0, abs=1e-6)


def test_resample_matches_polyphase() -> None:
    # band-limited (harmonics of 140 Hz up to 7 kHz): the two low-pass filters differ only near
    # the new Nyquist frequency, where their transition bands lie
    t = np.arange(44100) / 44100
    harmonics = np.stack([np.sin(2 * np.pi * 140 * k * t + k) / k for k in range(1, 51)])
    samples = (0.2 * harmonics.sum(axis=0)).astype(np.float32)
    got = resample(samples, 44100, 24000)
    want = resample_poly(samples.astype(np.float64), 240, 441)
    assert got.shape == want.shape == (24000,)
    inner = slice(500, -500)  # the two resamplers treat the edges differently
    np.testing.assert_allclose(got[inner], want[inner], rtol=0, atol=1e-3)  # measured 2.7e-4


def test_reference_mel_end_to_end() -> None:
    config = ReferenceMelConfig.from_vocoder_config({**VOCODER_CONFIG, "fmin": 20, "fmax": 11000})
    left = _speech_like(0.9, 24000, 4)
    right = 0.5 * _speech_like(0.9, 24000, 5)
    got = reference_mel(np.stack([left, right]), 24000, config)
    mono = (left + right) / 2
    filtered = sosfilt(butter(2, 70, "highpass", fs=24000, output="sos"), mono).astype(np.float32)
    gain = min(10 ** (-26 / 20) / np.sqrt(np.mean(filtered**2)), 1 / np.max(np.abs(filtered)))
    want = _numpy_log_mel(filtered * np.float32(gain), config)
    assert got.shape == (1, 40, want.shape[1]) and got.dtype == torch.float32
    np.testing.assert_allclose(got[0].numpy(), want, rtol=0, atol=3e-5)  # measured 1.6e-6
    # another rate is resampled first; the result feeds the encoder
    mel = reference_mel(_speech_like(0.9, 16000, 6), 16000, config)
    assert mel.shape == (1, 40, (21600 + 2 * config.pad - 1024) // 256 + 1)
    model = EcapaTdnn(EcapaConfig.from_vocoder_config(VOCODER_CONFIG))
    model.load_reference_state_dict(random_reference_state_dict(model.config, seed=0))
    with torch.no_grad():
        embedding = model(mel)
    assert embedding.shape == (1, 32) and bool(torch.isfinite(embedding).all())


def test_reference_mel_refusals() -> None:
    config = ReferenceMelConfig.from_vocoder_config(VOCODER_CONFIG)
    with pytest.raises(ValueError, match="silent"):
        reference_mel(np.zeros(24000, np.float32), 24000, config)
    with pytest.raises(ValueError, match="too short"):
        reference_mel(np.ones(300, np.float32), 24000, config)
    with pytest.raises(ValueError, match="float samples"):
        reference_mel(np.ones(24000, np.int16), 24000, config)
    with pytest.raises(ValueError, match="shape"):
        reference_mel(np.ones((1, 2, 24000), np.float32), 24000, config)
