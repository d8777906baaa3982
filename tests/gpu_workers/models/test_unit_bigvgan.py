"""The published audio decoder's generator against NVIDIA's `bigvgan` package (2.4.1, the
non-causal original the reference adapted), on random weights:

- SnakeBeta, Activation1d (its torch alias_free_activation: 2x up, SnakeBeta, 2x down,
  replicate padding on both sides) and the Kaiser-sinc filter: measured worst difference 0;
- AMPBlock1 as the package builds it (non-causal convs), and with its convolutions given the
  reference's causal padding (zero left pad (k - 1) * d): measured 0 (|x| up to ~3.4);
- the whole generator: with "causal": false against bigvgan.BigVGAN itself, fed the unit and
  speaker embedding; with the reference's causal convs and transposed convs against a
  re-assembly of the package's blocks with causal padding: measured 4.0e-7 and 3.6e-7
  (outputs ~0.16 RMS);
- streamed decoding equals the one-shot decode for chunks of 1 .. 60 units: measured 3.3e-7,
  while holding back nothing differs by 2.5e-2 (the look-ahead is real).

bigvgan 2.4.1 is installed with --no-deps (bin/setup's test branch): its package __init__
imports matplotlib, scipy and librosa for training utilities; where they are missing this
test puts empty stand-ins into sys.modules for the import only (nothing here calls them).
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.models.unit_bigvgan import (
    Activation1d,
    AMPBlock1,
    SnakeBeta,
    StreamReach,
    UnitBigVgan,
    UnitBigVganConfig,
    UnitStream,
    kaiser_sinc_filter,
    stream_reach,
)
from gpu_workers.models.unit_bigvgan_archive import (
    fold_weight_norm,
    load_generator,
    random_generator_state,
    unfold_weight_norm,
)
from gpu_workers.tiny.published_audio_decoder import TINY_GENERATOR


def _import_bigvgan() -> types.ModuleType:
    stubs = {
        "matplotlib": {"use": lambda *a, **k: None},
        "matplotlib.pylab": {},
        "scipy": {},
        "scipy.io": {},
        "scipy.io.wavfile": {"write": None},
        "librosa": {},
        "librosa.filters": {"mel": None},
    }
    added = []
    for name, attrs in stubs.items():
        try:
            importlib.import_module(name)
        except ImportError:
            module = types.ModuleType(name)
            module.__dict__.update(attrs)
            sys.modules[name] = module
            added.append(name)
    try:
        return importlib.import_module("bigvgan.bigvgan")
    finally:
        for name in added:  # the stubs were for the import only
            sys.modules.pop(name, None)


bigvgan = _import_bigvgan()
from bigvgan import activations as bv_activations
from bigvgan.alias_free_activation.torch.act import Activation1d as BvActivation1d
from bigvgan.alias_free_activation.torch.filter import kaiser_sinc_filter1d

NUM_UNITS = 64


def _config(**overrides: Any) -> UnitBigVganConfig:
    raw = {**TINY_GENERATOR, "num_units": NUM_UNITS, "finetune": True, "num_spk": 3, **overrides}
    return UnitBigVganConfig.from_reference(raw)


def _randomize_(module: nn.Module, seed: int) -> None:
    """Package modules: every parameter noise (a weight-normed conv's g and v too, so that the
    fold is exercised), snake logs near 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith((".alpha", ".beta")) or name in ("alpha", "beta"):
                p.copy_(0.1 * noise)
            elif name.endswith("weight_g"):
                p.copy_(0.5 + 0.2 * noise.abs())
            elif name.endswith("bias"):
                p.copy_(0.02 * noise)
            else:
                p.copy_(noise)


def _copy_snake(ours: SnakeBeta, theirs: nn.Module) -> None:
    with torch.no_grad():
        ours.alpha.copy_(theirs.alpha)
        ours.beta.copy_(theirs.beta)


# ---------------------------------------------------------------------------------------------
# Blocks


def test_kaiser_filter_and_snakebeta_match_bigvgan() -> None:
    ours = kaiser_sinc_filter(0.25, 0.3, 12)
    assert torch.equal(ours, kaiser_sinc_filter1d(0.25, 0.3, 12).view(-1))
    theirs = bv_activations.SnakeBeta(8, alpha_logscale=True)
    _randomize_(theirs, 1)
    snake = SnakeBeta(8, logscale=True)
    _copy_snake(snake, theirs)
    x = 2 * torch.randn(2, 8, 40, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(snake(x), theirs(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("length", [1, 2, 7, 50])
def test_activation1d_matches_bigvgan(length: int) -> None:
    """Non-causal: the package's Activation1d, replicate padding on both sides."""
    theirs = BvActivation1d(activation=bv_activations.SnakeBeta(6, alpha_logscale=True))
    _randomize_(theirs, 3)
    ours = Activation1d(6, logscale=True)
    _copy_snake(ours.act, theirs.act)
    x = torch.randn(2, 6, length, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got, want = ours(x), theirs(x)
    assert got.shape == want.shape == x.shape
    assert (got - want).abs().max().item() < 1e-6  # measured: 0


def _package_amp_block(channels: int, kernel: int, dilations: tuple[int, ...], seed: int) -> nn.Module:
    h = bigvgan.AttrDict({"snake_logscale": True})
    block = bigvgan.AMPBlock1(h, channels, kernel, dilations, activation="snakebeta")
    _randomize_(block, seed)
    with torch.no_grad():  # a residual branch that does not dwarf its input
        for conv in list(block.convs2):
            conv.weight_g.mul_(0.3 / math.sqrt(channels * kernel))
        for conv in list(block.convs1):
            conv.weight_g.mul_(1 / math.sqrt(channels * kernel))
    return block


def _causal_(block: nn.Module) -> nn.Module:
    """The package's AMPBlock1 with the reference's causal convolutions: each conv unpadded,
    behind a zero left pad of (k - 1) * d."""
    for convs in (block.convs1, block.convs2):
        for s, conv in enumerate(list(convs)):
            reach = (conv.kernel_size[0] - 1) * conv.dilation[0]
            conv.padding = (0,)
            convs[s] = nn.Sequential(nn.ConstantPad1d((reach, 0), 0.0), conv)
    return block


def _block_state(block: nn.Module) -> dict[str, torch.Tensor]:
    """The package block's state dict in the reference's names (convs under `.conv`)."""
    out = {}
    for name, t in block.state_dict().items():
        parts = name.split(".")
        if parts[0] in ("convs1", "convs2"):
            if parts[2] == "1":  # our _causal_ wrapper: Sequential(pad, conv)
                parts = parts[:2] + parts[3:]
            parts.insert(2, "conv")
        out[".".join(parts)] = t
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_amp_block_matches_bigvgan(causal: bool) -> None:
    kernel, dilations = 5, (1, 3, 5)
    theirs = _package_amp_block(8, kernel, dilations, seed=5)
    if causal:
        theirs = _causal_(theirs)
    config = _config(causal=causal, resblock_kernel_sizes=[5], resblock_dilation_sizes=[list(dilations)],
                     upsample_kernel_sizes=[16, 10, 8, 6, 4] if causal else [8, 5, 4, 3, 2])  # fmt: skip
    ours = AMPBlock1(8, kernel, dilations, config)
    state = {n: t for n, t in fold_weight_norm(_block_state(theirs)).items() if not n.endswith(".filter")}
    ours.load_state_dict(state, strict=True)
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        got, want = ours(x), theirs(x)
    assert (got - want).abs().max().item() < 1e-5  # measured: 0, |x| up to ~3.4


# ---------------------------------------------------------------------------------------------
# The whole generator


def _units_and_speaker(model: UnitBigVgan, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    units = torch.randint(0, NUM_UNITS, (2, t), generator=gen)
    speaker = model.voice_embedding(torch.tensor([0, 2]))
    return units, speaker


def _front(model: UnitBigVgan, units: torch.Tensor, speaker: torch.Tensor) -> torch.Tensor:
    """The reference's input to conv_pre, written out: embedding / sqrt(dim), speaker concatenated."""
    x = model.unit_emb.weight[units].transpose(1, 2) / math.sqrt(model.config.unit_emb_dim)
    return torch.cat([x, speaker[:, :, None].expand(-1, -1, units.shape[1])], dim=1)


def _package_generator(config: UnitBigVganConfig, seed: int) -> nn.Module:
    c = config
    h = bigvgan.AttrDict({
        "num_mels": c.unit_emb_dim + c.spk_emb_dim, "resblock": "1", "activation": "snakebeta",
        "snake_logscale": True, "upsample_rates": list(c.upsample_rates),
        "upsample_kernel_sizes": list(c.upsample_kernel_sizes), "upsample_initial_channel": c.upsample_initial_channel,
        "resblock_kernel_sizes": list(c.resblock_kernel_sizes),
        "resblock_dilation_sizes": [list(d) for d in c.resblock_dilation_sizes],
        "use_bias_at_final": True, "use_tanh_at_final": True,
    })  # fmt: skip
    model = bigvgan.BigVGAN(h)
    # weights as the reference's random generator draws them, moved into g/v form
    ours = unfold_weight_norm(random_generator_state(config, seed))
    theirs = {}
    for name, t in ours.items():
        if name.startswith(("unit_emb.", "spk_emb.")):
            continue
        theirs[name.replace(".conv.", ".").replace(".deconv.", ".")] = t
    for name, t in model.state_dict().items():
        if name.endswith(".filter"):
            theirs[name] = t
    model.load_state_dict(theirs, strict=True)
    return model.eval()


def test_noncausal_generator_matches_bigvgan() -> None:
    """With "causal": false the reference's generator is BigVGAN's after the embedding front."""
    config = _config(causal=False, upsample_kernel_sizes=[16, 11, 8, 7, 4])
    theirs = _package_generator(config, seed=8)
    ours = load_generator(config, unfold_weight_norm(random_generator_state(config, 8)), "test")
    units, speaker = _units_and_speaker(ours, 9, seed=9)
    with torch.no_grad():
        got = ours(units, speaker)
        want = theirs(_front(ours, units, speaker)).squeeze(1)
    assert got.shape == want.shape == (2, 9 * 960)
    assert 0.05 < got.std().item() and got.abs().max().item() < 0.99  # neither silent nor clipped
    assert (got - want).abs().max().item() < 1e-5  # measured: 4.0e-7


def _causal_reassembly(theirs: nn.Module, config: UnitBigVganConfig) -> Any:
    """The reference's causal generator from the package's blocks: conv_pre / conv_post behind
    a zero left pad of 6, each transposed conv unpadded behind a replicate pad of ceil(k/u) - 1
    with u samples dropped at both ends, AMPBlock1s with causal convs, the package's
    (non-causal) Activation1d for activation_post."""
    for block in theirs.resblocks:
        _causal_(block)
    for conv in (theirs.conv_pre, theirs.conv_post):
        conv.padding = (0,)
    for (up,) in theirs.ups:
        up.padding = (0,)
    k = config.num_kernels

    def forward(x: torch.Tensor) -> torch.Tensor:
        x = theirs.conv_pre(F.pad(x, (6, 0)))
        for i, (up,) in enumerate(theirs.ups):
            u, kernel = config.upsample_rates[i], config.upsample_kernel_sizes[i]
            y = up(F.pad(x, (math.ceil(kernel / u) - 1, 0), mode="replicate"))
            x = y[..., u:-u]
            x = sum(theirs.resblocks[i * k + j](x) for j in range(k)) / k
        x = theirs.conv_post(F.pad(theirs.activation_post(x), (6, 0)))
        return torch.tanh(x).squeeze(1)

    return forward


def test_causal_generator_matches_a_reassembly_of_bigvgan_blocks() -> None:
    config = _config()
    theirs = _package_generator(config, seed=10)
    forward = _causal_reassembly(theirs, config)
    ours = load_generator(config, unfold_weight_norm(random_generator_state(config, 10)), "test")
    units, speaker = _units_and_speaker(ours, 11, seed=11)
    with torch.no_grad():
        got, want = ours(units, speaker), forward(_front(ours, units, speaker))
    assert got.shape == want.shape == (2, 11 * 960)
    assert 0.05 < got.std().item() and got.abs().max().item() < 0.99
    assert (got - want).abs().max().item() < 1e-5  # measured: 3.6e-7


# ---------------------------------------------------------------------------------------------
# Streaming


def _stream(model: UnitBigVgan, units: list[int], speaker: torch.Tensor, size: int, reach: StreamReach) -> torch.Tensor:
    stream = UnitStream(reach, model.config.hop)
    pieces = []
    for i in range(0, len(units), size):
        window, first, end = stream.window(units[i : i + size], last=i + size >= len(units))
        with torch.no_grad():
            pieces.append(model(torch.tensor([window]), speaker)[0, first:end])
        stream.advance(first, end)
        assert len(stream.units) <= reach.context_units + size + math.ceil(reach.lookahead / 960) + 1
    return torch.cat(pieces)


@pytest.mark.parametrize("size", [1, 2, 5, 13, 25, 60])
def test_streamed_equals_one_shot(size: int) -> None:
    config = _config()
    model = load_generator(config, unfold_weight_norm(random_generator_state(config, 12)), "test")
    units = torch.randint(0, NUM_UNITS, (60,), generator=torch.Generator().manual_seed(13)).tolist()
    speaker = model.voice_embedding(torch.tensor([1]))
    with torch.no_grad():
        one_shot = model(torch.tensor([units]), speaker)[0]
    streamed = _stream(model, units, speaker, size, stream_reach(config))
    assert streamed.shape == one_shot.shape == (60 * 960,)
    assert (streamed - one_shot).abs().max().item() < 5e-6  # measured: 3.3e-7


def test_holding_back_nothing_is_not_exact() -> None:
    """The activations' look-ahead is real: giving every sample at once differs from one-shot."""
    config = _config()
    model = load_generator(config, unfold_weight_norm(random_generator_state(config, 12)), "test")
    units = torch.randint(0, NUM_UNITS, (40,), generator=torch.Generator().manual_seed(14)).tolist()
    speaker = model.voice_embedding(torch.tensor([1]))
    with torch.no_grad():
        one_shot = model(torch.tensor([units]), speaker)[0]
    eager = StreamReach(stream_reach(config).context_units, 0)
    assert (_stream(model, units, speaker, 5, eager) - one_shot).abs().max().item() > 1e-3


# ---------------------------------------------------------------------------------------------
# Config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"resblock": "2"}, "resblock"),
        ({"activation": "snake"}, "activation"),
        ({"use_tanh_at_final": False}, "use_tanh_at_final"),
        ({"upsample_kernel_sizes": [16, 10, 8, 6, 5]}, "kernel = 2 \\* rate"),
        ({"snake_logscale": "yes"}, "snake_logscale"),
    ],
)
def test_unsupported_configs_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _config(**overrides)


