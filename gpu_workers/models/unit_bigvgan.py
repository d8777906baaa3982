"""The published audio decoder: the reference's unit BigVGAN, read in place from decoder/audio/.

The download's decoder/audio/ holds two TorchServe archives (zip files), each a generator of
its own with its own config.json:

    NCCosybigvganDecoder.mar     named voices: spk_emb is a table, spk_list.txt names its rows
    NCZSCosybigvganDecoder.mar   zero-shot: spk_emb is an ECAPA-TDNN over a reference's mel

In each, MAR-INF/MANIFEST.json names the serialized weights (model.serializedFile), a torch
pickle whose "generator" entry is the state dict. It is read with weights_only=True: tensors
and plain containers, never code.

The generator, for T units (hop = prod(upsample_rates) output samples per unit):

    unit_emb(units) * unit_emb_dim^-0.5 (B, E, T), speaker (B, S) broadcast, concatenated
    conv_pre (k 7)                                      (B, C0, T)
    stage i: ups[i] (transposed conv, stride u_i)       (B, C0 / 2^(i+1), T * u_0 ... u_i)
             mean of the stage's AMPBlock1s (one per resblock kernel size)
    activation_post, conv_post (k 7), tanh              (B, T * hop)

AMPBlock1: per dilation d, x <- x + conv2_k(act(conv1_{k,d}(act(x)))). With config "causal"
(the reference's default) every convolution is causal: zero left padding (k - 1) * d; each
transposed convolution replicates its first input frame ceil(k / u) - 1 times on the left,
runs with no padding, and drops u samples at both ends (T * u samples when k = 2u). The
anti-aliased activations are NOT causal, whatever the config says: Activation1d upsamples 2x
(replicate padding on both sides, a 12-tap Kaiser-sinc filter), applies SnakeBeta, low-pass
filters and downsamples 2x (replicate padding on both sides again). Each therefore looks
5 input samples ahead (and back).

Streaming. Because of that look-ahead the samples near the end of the units known so far are
not final until more units come (or the span ends, where the replicate padding applies). A
stream (UnitStream) keeps the units it has had and emits, at each chunk, only the samples
that no future unit can change; it recomputes them from a window of units that starts early
enough for the window's own left edge not to reach them:

    units known:     |<------------------------- total ------------------------->|
    window:               [start ......................................... total)
    emitted before:  [0 ........................ emitted)
    emitted now:                                 [emitted ..... total*hop - lookahead)
                                                 (..... total*hop on the last chunk)

`stream_reach` bounds both distances from the layers' kernels (StreamReach): `context_units`
(how far back an output sample's inputs and the window's left padding reach) and `lookahead`
(how far ahead, in output samples). So decoding in chunks gives the one-shot samples, up to
the float rounding of convolutions over different lengths (about 1e-7).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.models.unit_vocoder import SnakeBeta, UpsampleStages  # the same activation

NAMED_VOICES_ARCHIVE = "NCCosybigvganDecoder.mar"
ZERO_SHOT_ARCHIVE = "NCZSCosybigvganDecoder.mar"
MANIFEST = "MAR-INF/MANIFEST.json"
CONFIG_FILE = "config.json"
SPEAKER_LIST = "spk_list.txt"
SAMPLE_RATE = 24000  # the reference's output rate (SAMPLE_RATE in its model_concrete*.py)
_EDGE_KERNEL = 7  # conv_pre and conv_post
# Activation1d as the reference builds it: 2x up and down, 12 taps, cutoff 0.5 / ratio and
# transition half width 0.6 / ratio (not in config.json: fixed in its code)
_AA_RATIO = 2
_AA_TAPS = 12


# ---------------------------------------------------------------------------------------------
# Config


def _int_list(raw: Mapping[str, Any], key: str) -> tuple[int, ...]:
    value = raw.get(key)
    if not isinstance(value, list | tuple) or not value or any(
        not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in value
    ):
        raise ValueError(f"unit BigVGAN config: {key} must be a non-empty list of positive ints, got {value!r}")
    return tuple(value)


def _positive_int(raw: Mapping[str, Any], key: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"unit BigVGAN config: {key} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class UnitBigVganConfig(UpsampleStages):
    """The fields of an archive's config.json that the generator uses (the reference's names);
    `raw` keeps the whole file (the zero-shot speaker encoder reads its own fields from it)."""

    num_units: int
    unit_emb_dim: int
    spk_emb_dim: int
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    upsample_initial_channel: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    snake_logscale: bool
    use_bias_at_final: bool = True
    causal: bool = True
    finetune: bool = False  # True: named voices (spk_emb is a table of num_spk rows)
    num_spk: int = 0
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_reference(cls, raw: Mapping[str, Any]) -> UnitBigVganConfig:
        """Read config.json; refuse what the generator does not implement, by name."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"unit BigVGAN config: want a JSON object, got {type(raw).__name__}")  # noqa: TRY004
        if str(raw.get("resblock")) != "1":
            raise ValueError(f"unit BigVGAN config: resblock {raw.get('resblock')!r} is not supported (only \"1\", AMPBlock1)")
        if raw.get("activation") != "snakebeta":
            raise ValueError(f"unit BigVGAN config: activation {raw.get('activation')!r} is not supported (only \"snakebeta\")")
        if raw.get("use_tanh_at_final", True) is not True:
            raise ValueError("unit BigVGAN config: use_tanh_at_final false (a clamp at the end) is not supported")
        flags = {}
        for key, default in (("snake_logscale", None), ("use_bias_at_final", True), ("causal", True), ("finetune", False)):
            value = raw.get(key, default)
            if not isinstance(value, bool):
                raise ValueError(f"unit BigVGAN config: {key} must be true or false, got {value!r}")  # noqa: TRY004
            flags[key] = value
        dilations = raw.get("resblock_dilation_sizes")
        if not isinstance(dilations, list | tuple):
            raise ValueError(f"unit BigVGAN config: resblock_dilation_sizes must be a list of lists, got {dilations!r}")  # noqa: TRY004
        config = cls(
            num_units=_positive_int(raw, "num_units"),
            unit_emb_dim=_positive_int(raw, "unit_emb_dim"),
            spk_emb_dim=_positive_int(raw, "spk_emb_dim"),
            upsample_rates=_int_list(raw, "upsample_rates"),
            upsample_kernel_sizes=_int_list(raw, "upsample_kernel_sizes"),
            upsample_initial_channel=_positive_int(raw, "upsample_initial_channel"),
            resblock_kernel_sizes=_int_list(raw, "resblock_kernel_sizes"),
            resblock_dilation_sizes=tuple(_int_list({"d": d}, "d") for d in dilations),
            num_spk=_positive_int(raw, "num_spk") if flags["finetune"] else 0,
            raw=dict(raw),
            **flags,
        )
        config.check()
        return config

    def check(self) -> None:
        rates, kernels = self.upsample_rates, self.upsample_kernel_sizes
        if len(kernels) != len(rates):
            raise ValueError(f"unit BigVGAN config: {len(kernels)} upsample_kernel_sizes for {len(rates)} upsample_rates")
        if self.causal and any(k != 2 * u for k, u in zip(kernels, rates, strict=True)):
            # the causal transposed conv gives T * u samples of T only then (see the module doc)
            raise ValueError(
                f"unit BigVGAN config: a causal upsampler needs kernel = 2 * rate, got kernels {list(kernels)} "
                f"for rates {list(rates)}"
            )
        if not self.causal and any((k - u) % 2 or k < u for k, u in zip(kernels, rates, strict=True)):
            raise ValueError(f"unit BigVGAN config: non-causal kernels {list(kernels)} minus rates must be even and >= 0")
        if self.upsample_initial_channel % 2 ** len(rates):
            raise ValueError(f"unit BigVGAN config: upsample_initial_channel must halve {len(rates)} times")
        if len(self.resblock_dilation_sizes) != len(self.resblock_kernel_sizes):
            raise ValueError("unit BigVGAN config: one resblock_dilation_sizes list per resblock kernel size")
        if not self.causal and any(k % 2 == 0 for k in self.resblock_kernel_sizes):
            raise ValueError("unit BigVGAN config: non-causal resblock kernels must be odd")


# ---------------------------------------------------------------------------------------------
# Modules, small to large. Names follow the reference's state dict (after weight norm is folded).


def kaiser_sinc_filter(cutoff: float, half_width: float, kernel_size: int) -> torch.Tensor:
    """(kernel_size,) low-pass taps summing to 1: a sinc at `cutoff` (cycles per sample) under a
    Kaiser window whose beta meets the transition half width (Kaiser's design formulas); for
    an even size the taps sit between samples, at -K/2 + 0.5 ... K/2 - 0.5."""
    half = kernel_size // 2
    attenuation = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(kernel_size, periodic=False, beta=beta, dtype=torch.float32, device="cpu")
    if kernel_size % 2 == 0:
        times = torch.arange(-half, half, dtype=torch.float32, device="cpu") + 0.5
    else:
        times = torch.arange(kernel_size, dtype=torch.float32, device="cpu") - half
    taps = 2 * cutoff * window * torch.sinc(2 * cutoff * times)
    return taps / taps.sum()


class _Filter(nn.Module):
    """A resampler's low-pass taps, computed from the constants above (the archives store the
    same numbers as buffers; load_generator checks that they are)."""

    filter: torch.Tensor  # (1, 1, K)

    def __init__(self) -> None:
        super().__init__()
        taps = kaiser_sinc_filter(0.5 / _AA_RATIO, 0.6 / _AA_RATIO, _AA_TAPS)
        self.register_buffer("filter", taps.view(1, 1, -1), persistent=False)


class _LowPass(_Filter):
    pass


class _DownSample(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lowpass = _LowPass()


class Activation1d(nn.Module):
    """SnakeBeta at twice the rate, non-causal. For T input samples:

        upsample: replicate-pad p = K / r - 1 each side, r * transposed conv (stride r) with
                  the filter, keep the T * r samples centred on the input (crop p * r +
                  (K - r) // 2 on the left, p * r + (K - r + 1) // 2 on the right)
        SnakeBeta
        downsample: replicate-pad K / 2 - 1 left, K / 2 right (even K), filter, stride r
    """

    def __init__(self, channels: int, logscale: bool) -> None:
        super().__init__()
        self.upsample = _Filter()
        self.act = SnakeBeta(channels, logscale)
        self.downsample = _DownSample()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, r, k = x.shape[1], _AA_RATIO, _AA_TAPS
        pad = k // r - 1
        up = F.pad(x, (pad, pad), mode="replicate")  # (B, C, T + 2p)
        up = r * F.conv_transpose1d(up, self.upsample.filter.expand(c, 1, k), stride=r, groups=c)
        left = pad * r + (k - r) // 2
        up = up[..., left : left + x.shape[-1] * r]  # (B, C, T * r)
        y = self.act(up)
        y = F.pad(y, (k // 2 - (k % 2 == 0), k // 2), mode="replicate")
        return F.conv1d(y, self.downsample.lowpass.filter.expand(c, 1, k), stride=r, groups=c)  # (B, C, T)


class _Conv(nn.Module):
    """A Conv1d under `.conv`: causal (zero left padding (k - 1) * d) or centred."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int, causal: bool, bias: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, bias=bias)
        reach = (kernel - 1) * dilation
        self.padding = (reach, 0) if causal else (reach // 2, reach // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, self.padding))


class _Up(nn.Module):
    """A ConvTranspose1d under `.deconv`, stride u, T -> T * u samples.

    Causal (k = 2u): replicate the first frame once on the left, no padding, drop u samples
    at each end; output t * u + p then reads inputs t - 1 and t. Non-causal: the usual
    padding (k - u) / 2."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.stride = stride
        self.left = -(-kernel // stride) - 1
        self.deconv = nn.ConvTranspose1d(c_in, c_out, kernel, stride, padding=0 if causal else (kernel - stride) // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.causal:
            return self.deconv(x)
        y = self.deconv(F.pad(x, (self.left, 0), mode="replicate"))
        return y[..., self.stride : y.shape[-1] - self.stride]


class AMPBlock1(nn.Module):
    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...], config: UnitBigVganConfig) -> None:
        super().__init__()
        causal = config.causal
        self.convs1 = nn.ModuleList(_Conv(channels, channels, kernel, d, causal) for d in dilations)
        self.convs2 = nn.ModuleList(_Conv(channels, channels, kernel, 1, causal) for _ in dilations)
        self.activations = nn.ModuleList(
            Activation1d(channels, config.snake_logscale) for _ in range(2 * len(dilations))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acts = list(self.activations)
        for conv1, conv2, act1, act2 in zip(self.convs1, self.convs2, acts[::2], acts[1::2], strict=True):
            x = x + conv2(act2(conv1(act1(x))))
        return x  # (B, C, T)


class UnitBigVgan(nn.Module):
    """One archive's generator. forward(units (B, T), speaker (B, spk_emb_dim)) -> (B, T * hop).

    `spk_emb` (the named voices' table) exists only for a finetune (named-voice) config; the
    zero-shot speaker encoder is a module of its own (gpu_workers/models/ecapa_tdnn.py)."""

    def __init__(self, config: UnitBigVganConfig) -> None:
        super().__init__()
        c = config
        self.config = config
        self.unit_emb = nn.Embedding(c.num_units, c.unit_emb_dim)
        self.spk_emb = nn.Embedding(c.num_spk, c.spk_emb_dim) if c.finetune else None
        self.conv_pre = _Conv(c.unit_emb_dim + c.spk_emb_dim, c.upsample_initial_channel, _EDGE_KERNEL, 1, c.causal)
        self.ups = nn.ModuleList(
            nn.ModuleList([_Up(c.stage_channels(i - 1), c.stage_channels(i), k, u, c.causal)])
            for i, (u, k) in enumerate(zip(c.upsample_rates, c.upsample_kernel_sizes, strict=True))
        )
        self.resblocks = nn.ModuleList(
            AMPBlock1(c.stage_channels(i), k, d, c)
            for i in range(len(c.upsample_rates))
            for k, d in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes, strict=True)
        )
        last = c.stage_channels(len(c.upsample_rates) - 1)
        self.activation_post = Activation1d(last, c.snake_logscale)
        self.conv_post = _Conv(last, 1, _EDGE_KERNEL, 1, c.causal, bias=c.use_bias_at_final)

    def voice_embedding(self, index: torch.Tensor) -> torch.Tensor:
        """(B,) rows of the named voices' table -> (B, spk_emb_dim)."""
        if self.spk_emb is None:
            raise ValueError("this generator has no named voices (a zero-shot archive)")
        return self.spk_emb(index)

    def forward(self, units: torch.Tensor, speaker: torch.Tensor) -> torch.Tensor:
        c = self.config
        x = self.unit_emb(units).transpose(1, 2) * c.unit_emb_dim**-0.5  # (B, E, T)
        voice = speaker.to(x.dtype)[:, :, None].expand(-1, -1, x.shape[-1])  # (B, S, T)
        x = self.conv_pre(torch.cat([x, voice], dim=1))  # (B, C0, T)
        k = c.num_kernels
        for i, stage in enumerate(self.ups):
            assert isinstance(stage, nn.ModuleList)  # ups.{i}.0: the reference's nesting
            x = stage[0](x)  # (B, C_i, T * stage_rate(i))
            mixed = self.resblocks[i * k](x)
            for j in range(1, k):
                mixed = mixed + self.resblocks[i * k + j](x)
            x = mixed / k
        x = self.conv_post(self.activation_post(x))  # (B, 1, T * hop)
        return torch.tanh(x).squeeze(1)


# ---------------------------------------------------------------------------------------------
# Streaming: how far an output sample's inputs reach, and one stream's window.


def _activation_reach() -> tuple[int, int]:
    """(back, ahead) input samples one Activation1d output reads, away from the edges."""
    r, k = _AA_RATIO, _AA_TAPS
    pad = k // r - 1
    crop = pad * r + (k - r) // 2

    def up_inputs(n: int) -> tuple[int, int]:  # upsampled sample n <- inputs [lo, hi]
        m = n + crop  # index into the transposed conv's full output over the padded input
        return -(-(m - k + 1) // r) - pad, m // r - pad

    i = 100  # any output well inside
    first = r * i - (k // 2 - (k % 2 == 0))  # the downsampling window's first upsampled sample
    return i - up_inputs(first)[0], up_inputs(first + k - 1)[1] - i


@dataclass(frozen=True, slots=True)
class StreamReach:
    context_units: int  # a window starts this many units before the first sample it must give
    lookahead: int  # output samples held back before the end of the known units


def stream_reach(config: UnitBigVganConfig) -> StreamReach:
    """Bounds, not exact values: a layer at `rate` samples per unit whose output at t reads its
    input over [t - back, t + ahead] moves an output sample's dependence by back (ahead)
    samples at that rate; layers at one rate add up exactly, and each change of rate adds at
    most one sample of rounding. The window's left padding spreads right by the same backs."""
    c = config
    act_back, act_ahead = _activation_reach()

    def conv(k: int, d: int) -> tuple[int, int]:
        return ((k - 1) * d, 0) if c.causal else ((k - 1) * d // 2, (k - 1) * d // 2)

    back = float(conv(_EDGE_KERNEL, 1)[0] + 1)  # in units (conv_pre runs at one sample per unit)
    ahead = float(conv(_EDGE_KERNEL, 1)[1] + 1)
    for i, (u, k) in enumerate(zip(c.upsample_rates, c.upsample_kernel_sizes, strict=True)):
        rate_in = c.stage_rate(i - 1)
        up_reach = -(-k // u)  # input frames one output reads, either side at most
        back += (up_reach + 1) / rate_in
        ahead += ((0 if c.causal else up_reach) + 1) / rate_in
        stage_back = stage_ahead = 0
        for kernel, dilations in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes, strict=True):
            b = sum(conv(kernel, d)[0] + conv(kernel, 1)[0] + 2 * act_back for d in dilations)
            a = sum(conv(kernel, d)[1] + conv(kernel, 1)[1] + 2 * act_ahead for d in dilations)
            stage_back, stage_ahead = max(stage_back, b), max(stage_ahead, a)
        if i == len(c.upsample_rates) - 1:  # activation_post and conv_post run at this rate too
            stage_back += act_back + conv(_EDGE_KERNEL, 1)[0]
            stage_ahead += act_ahead + conv(_EDGE_KERNEL, 1)[1]
        back += (stage_back + 1) / c.stage_rate(i)
        ahead += (stage_ahead + 1) / c.stage_rate(i)
    return StreamReach(math.ceil(back) + 1, math.ceil(ahead * c.hop))


@dataclass(slots=True)
class UnitStream:
    """One span being decoded: the units a window may still need, and how far it has emitted.

        units      the stream's units [start, total)
        emitted    output samples already given out (of total * hop when it ends)
    """

    reach: StreamReach
    hop: int
    units: list[int] = field(default_factory=list)
    start: int = 0
    emitted: int = 0

    @property
    def total(self) -> int:
        return self.start + len(self.units)

    def window(self, new_units: Sequence[int], last: bool) -> tuple[list[int], int, int]:
        """Take the chunk's units -> (window units, first, end): the samples to give out now
        are [first, end) of the window's output."""
        self.units.extend(new_units)
        end = self.total * self.hop if last else max(self.emitted, self.total * self.hop - self.reach.lookahead)
        return list(self.units), self.emitted - self.start * self.hop, end - self.start * self.hop

    def advance(self, first: int, end: int) -> None:
        """The window's samples [first, end) went out: forget the units no later window needs."""
        self.emitted += end - first
        keep_from = max(0, self.emitted // self.hop - self.reach.context_units)
        if keep_from > self.start:
            del self.units[: keep_from - self.start]
            self.start = keep_from
