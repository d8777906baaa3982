"""The zero-shot audio decoder's speaker encoder: ECAPA-TDNN over a log-mel of the reference.

The published zero-shot vocoder (.mar NCZSCosybigvganDecoder) turns a reference recording into
one speaker vector, which its generator broadcasts over time beside the unit embeddings.
Two parts, as the reference computes them (PUBLISHED_CHECKPOINT.md 5.4 and 5.5):

1. `reference_mel`: samples -> (1, num_mels, T) natural-log mel at the vocoder's rate.

    mono (mean of channels), resampled to sampling_rate              (N,)
    high-pass: 2nd-order Butterworth at 70 Hz, causal, zero state    (N,)   scipy butter + sosfilt
    gain to -26 dBFS RMS, but never past a peak of 1                 (N,)
    reflect pad (n_fft - hop) // 2 each side, STFT center=False,
    periodic hann(win_size), |X| = sqrt(re^2 + im^2 + 1e-9)          (n_fft // 2 + 1, T)
    slaney mel filters (slaney scale and area norm, fmin..fmax)      (num_mels, T)
    ln(max(mel, 1e-5))

2. `EcapaTdnn`: the lawlict / UniSpeech ECAPA-TDNN (arXiv 2005.07143), C = channels:

    mel                                              (B, num_mels, T)
    layer1  conv k5 -> ReLU -> BN                    (B, C, T)
    layer2..4 (dilation 2, 3, 4), each x + block(x):
        conv_in  1x1 conv -> ReLU -> BN
        res2     8 groups of C/8: y_0 = f_0(x_0), y_i = f_i(x_i + y_{i-1}) for i < 7,
                 y_7 = x_7 (the LAST group passes through), f_i = conv k3 -> ReLU -> BN
        conv_out 1x1 conv -> ReLU -> BN
        se       x * sigmoid(W2 relu(W1 mean_t(x)))  (bottleneck 128)
    mfa     cat(layer2, layer3, layer4) -> 1x1 conv (with bias) -> ReLU     (B, 3C, T)
    pooling attentive statistics: alpha = softmax_t(V tanh(W h)), where h is x or, with
            global_context_att, cat(x, mean_t x, sqrt(var_t x + 1e-10)) (unbiased var);
            out = cat(sum alpha x, sqrt(max(sum alpha x^2 - mean^2, 1e-9)))   (B, 6C)
    bn -> linear -> bn_out                                                 (B, embed_dim)

Every conv inside the blocks is bias-free with zero padding. Note the order conv -> ReLU -> BN
(not conv -> BN -> ReLU), and that the reference defines an InstanceNorm it never applies: the
mel goes in as it is. BatchNorm always uses its running statistics here (the reference serves
in eval mode); this module has no training mode.

Weight names are ours; `load_reference_state_dict` takes the reference's (the generator dict's
`spk_emb.` entries, prefix stripped): layer{2,3,4}.Conv1dReluBn1 / Res2Conv1dReluBn /
Conv1dReluBn2 / SE_Connect are our conv_in / res2 / conv_out / se, and the top-level `conv` is
our `mfa`. Everything else has the same name.

What differs from the reference's preprocessing: it decodes with pydub and resamples with
librosa (soxr "hq"); we take decoded samples and resample with PyAV (FFmpeg's swresample, as
omni/shared/media does), which agrees with scipy's resample_poly to about 3e-4 on band-limited
audio away from the edges (the two differ near the new Nyquist frequency and at the ends).
Its optional AUDIOLLM_DOWN_SAMPLE_RATE detour (load at a lower rate, then resample up) is not
done. The high-pass runs in float64 like scipy's sosfilt (on float32 samples), so it
matches it to float64 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import nn

_RES2_SCALE = 8  # Res2Net groups in layer2..4
_SE_BOTTLENECK = 128
_ATTENTION_CHANNELS = 128
_BN_EPS = 1e-5  # nn.BatchNorm1d's default, which the reference uses
_DILATIONS = {"layer2": 2, "layer3": 3, "layer4": 4}

# our block names -> the reference's (inside layer2..4), and our top-level `mfa` -> `conv`
_REFERENCE_BLOCK_NAMES = {
    "conv_in": "Conv1dReluBn1",
    "res2": "Res2Conv1dReluBn",
    "conv_out": "Conv1dReluBn2",
    "se": "SE_Connect",
}

_HIGHPASS_HZ = 70.0
_VOLUME_LEVEL = 10.0 ** (-26.0 / 20.0)  # -26 dBFS RMS
_HIGHPASS_BLOCK = 128  # samples per block of the vectorised IIR filter
_MAGNITUDE_EPS = 1e-9
_LOG_FLOOR = 1e-5


def _config_int(h: Mapping[str, Any], key: str) -> int:
    if key not in h:
        raise ValueError(f"vocoder config: missing {key!r}")
    value = h[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"vocoder config: {key!r} must be a positive integer, got {value!r}")
    return value


def _config_float(h: Mapping[str, Any], key: str) -> float:
    if key not in h:
        raise ValueError(f"vocoder config: missing {key!r}")
    value = h[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"vocoder config: {key!r} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class EcapaConfig:
    num_mels: int
    channels: int  # spk_hidden_dim
    embed_dim: int  # spk_emb_dim
    global_context_att: bool

    def __post_init__(self) -> None:
        for name in ("num_mels", "channels", "embed_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"EcapaConfig.{name} must be a positive integer, got {value!r}")
        if self.channels % _RES2_SCALE:
            raise ValueError(f"EcapaConfig.channels ({self.channels}) must be a multiple of {_RES2_SCALE}")

    @classmethod
    def from_vocoder_config(cls, h: Mapping[str, Any]) -> EcapaConfig:
        """From the zero-shot .mar's config.json (the keys the reference's BigVGAN reads)."""
        if "global_context_att" not in h:
            raise ValueError("vocoder config: missing 'global_context_att'")
        if not isinstance(h["global_context_att"], bool):
            raise ValueError(f"vocoder config: 'global_context_att' must be a boolean, got {h['global_context_att']!r}")
        return cls(
            num_mels=_config_int(h, "num_mels"),
            channels=_config_int(h, "spk_hidden_dim"),
            embed_dim=_config_int(h, "spk_emb_dim"),
            global_context_att=h["global_context_att"],
        )


class FrozenBatchNorm1d(nn.Module):
    """BatchNorm1d in eval mode only: (x - running_mean) / sqrt(running_var + eps) * weight + bias."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.running_mean: torch.Tensor
        self.running_var: torch.Tensor
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C) or (B, C, T)
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, _BN_EPS)


class ConvReluBn(nn.Module):
    """conv (no bias, zero padding) -> ReLU -> BN, in that order."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 1, dilation: int = 1) -> None:
        super().__init__()
        padding = dilation * (kernel_size - 1) // 2
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=padding, dilation=dilation, bias=False)
        self.bn = FrozenBatchNorm1d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(F.relu(self.conv(x)))


class Res2ConvReluBn(nn.Module):
    """Res2Net's hierarchical convs over 8 channel groups; the last group passes through."""

    def __init__(self, channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.width = channels // _RES2_SCALE
        padding = dilation * (kernel_size - 1) // 2
        self.convs = nn.ModuleList(
            nn.Conv1d(self.width, self.width, kernel_size, padding=padding, dilation=dilation, bias=False)
            for _ in range(_RES2_SCALE - 1)
        )
        self.bns = nn.ModuleList(FrozenBatchNorm1d(self.width) for _ in range(_RES2_SCALE - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T)
        groups = torch.split(x, self.width, dim=1)  # 8 x (B, C/8, T)
        outs: list[torch.Tensor] = []
        y = groups[0]
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            y = bn(F.relu(conv(y if i == 0 else y + groups[i])))
            outs.append(y)
        outs.append(groups[-1])
        return torch.cat(outs, dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, bottleneck: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(channels, bottleneck)
        self.linear2 = nn.Linear(bottleneck, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T)
        gate = torch.sigmoid(self.linear2(F.relu(self.linear1(x.mean(dim=2)))))  # (B, C)
        return x * gate.unsqueeze(2)


class SeRes2Block(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.conv_in = ConvReluBn(channels, channels)
        self.res2 = Res2ConvReluBn(channels, kernel_size=3, dilation=dilation)
        self.conv_out = ConvReluBn(channels, channels)
        self.se = SqueezeExcite(channels, _SE_BOTTLENECK)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T)
        return x + self.se(self.conv_out(self.res2(self.conv_in(x))))


class AttentiveStatsPool(nn.Module):
    """Attention-weighted mean and standard deviation over time, per channel."""

    def __init__(self, channels: int, global_context_att: bool) -> None:
        super().__init__()
        self.global_context_att = global_context_att
        in_channels = 3 * channels if global_context_att else channels
        self.linear1 = nn.Conv1d(in_channels, _ATTENTION_CHANNELS, kernel_size=1)
        self.linear2 = nn.Conv1d(_ATTENTION_CHANNELS, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, D, T) -> (B, 2D)
        h = x
        if self.global_context_att:
            mean = x.mean(dim=2, keepdim=True).expand_as(x)
            std = torch.sqrt(x.var(dim=2, keepdim=True) + 1e-10).expand_as(x)
            h = torch.cat((x, mean, std), dim=1)  # (B, 3D, T)
        alpha = torch.softmax(self.linear2(torch.tanh(self.linear1(h))), dim=2)  # (B, D, T)
        mean = (alpha * x).sum(dim=2)
        var = (alpha * x * x).sum(dim=2) - mean * mean
        return torch.cat((mean, torch.sqrt(var.clamp(min=1e-9))), dim=1)


class EcapaTdnn(nn.Module):
    def __init__(self, config: EcapaConfig) -> None:
        super().__init__()
        self.config = config
        c = config.channels
        self.layer1 = ConvReluBn(config.num_mels, c, kernel_size=5)
        self.layer2 = SeRes2Block(c, _DILATIONS["layer2"])
        self.layer3 = SeRes2Block(c, _DILATIONS["layer3"])
        self.layer4 = SeRes2Block(c, _DILATIONS["layer4"])
        self.mfa = nn.Conv1d(3 * c, 3 * c, kernel_size=1)
        self.pooling = AttentiveStatsPool(3 * c, config.global_context_att)
        self.bn = FrozenBatchNorm1d(6 * c)
        self.linear = nn.Linear(6 * c, config.embed_dim)
        self.bn_out = FrozenBatchNorm1d(config.embed_dim)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:  # (B, num_mels, T) -> (B, embed_dim)
        if mel.dim() != 3 or mel.shape[1] != self.config.num_mels:
            raise ValueError(f"speaker encoder input must be (B, {self.config.num_mels}, T), got {tuple(mel.shape)}")
        out1 = self.layer1(mel)  # (B, C, T)
        out2 = self.layer2(out1)
        out3 = self.layer3(out2)
        out4 = self.layer4(out3)
        x = F.relu(self.mfa(torch.cat((out2, out3, out4), dim=1)))  # (B, 3C, T)
        x = self.bn(self.pooling(x))  # (B, 6C)
        return self.bn_out(self.linear(x))  # (B, embed_dim)

    def reference_names(self) -> dict[str, str]:
        """The reference's name of each of our state-dict entries."""
        return {name: _reference_name(name) for name in self.state_dict()}

    def load_reference_state_dict(self, sd: Mapping[str, torch.Tensor]) -> None:
        """Load the reference's `spk_emb.*` tensors (prefix stripped): all of them, nothing else,
        each of its shape. A BatchNorm's `num_batches_tracked` may be there or not (unused)."""
        ours_by_reference = {ref: ours for ours, ref in self.reference_names().items()}
        batch_norms = {_reference_name(name) for name, m in self.named_modules() if isinstance(m, FrozenBatchNorm1d)}
        given = {
            key: tensor
            for key, tensor in sd.items()
            if not (key.endswith(".num_batches_tracked") and key.rsplit(".", 1)[0] in batch_norms)
        }
        missing = sorted(set(ours_by_reference) - set(given))
        unexpected = sorted(set(given) - set(ours_by_reference))
        if missing or unexpected:
            raise ValueError(f"speaker encoder (ECAPA-TDNN) weights: missing {missing}, unexpected {unexpected}")
        own = self.state_dict()
        for key, tensor in given.items():
            want = own[ours_by_reference[key]].shape
            if tuple(tensor.shape) != tuple(want):
                raise ValueError(
                    f"speaker encoder (ECAPA-TDNN) weight {key}: shape {tuple(tensor.shape)}, want {tuple(want)}"
                )
        self.load_state_dict({ours_by_reference[key]: tensor for key, tensor in given.items()}, strict=True)


def _reference_name(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "mfa":
        parts[0] = "conv"
    elif parts[0] in _DILATIONS:
        parts[1] = _REFERENCE_BLOCK_NAMES[parts[1]]
    return ".".join(parts)


def random_reference_state_dict(config: EcapaConfig, seed: int) -> dict[str, torch.Tensor]:
    """Random weights under the reference's names, the same for the same seed: fan-in scaled
    weights, small biases, BN statistics near (0, 1), num_batches_tracked as a real file has."""
    gen = torch.Generator().manual_seed(seed)
    model = EcapaTdnn(config)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        shape = tuple(tensor.shape)
        leaf = name.rsplit(".", 1)[1]
        if leaf == "weight" and len(shape) > 1:
            fan_in = math.prod(shape[1:])
            value = torch.randn(shape, generator=gen) / math.sqrt(fan_in)
        elif leaf == "weight":  # a BatchNorm's scale
            value = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif leaf == "running_var":
            value = 0.5 + torch.rand(shape, generator=gen)
        else:  # biases, BatchNorm shifts and running means
            value = 0.1 * torch.randn(shape, generator=gen)
        out[_reference_name(name)] = value
    for name, module in model.named_modules():
        if isinstance(module, FrozenBatchNorm1d):
            out[_reference_name(name) + ".num_batches_tracked"] = torch.tensor(1000, dtype=torch.long)
    return out


@dataclass(frozen=True, slots=True)
class ReferenceMelConfig:
    sampling_rate: int
    n_fft: int
    hop_size: int
    win_size: int
    num_mels: int
    fmin: float
    fmax: float | None  # None: sampling_rate / 2 (librosa's default)

    def __post_init__(self) -> None:
        for name in ("sampling_rate", "n_fft", "hop_size", "win_size", "num_mels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ReferenceMelConfig.{name} must be a positive integer, got {value!r}")
        if self.win_size > self.n_fft or self.hop_size > self.n_fft:
            raise ValueError(f"ReferenceMelConfig: win_size and hop_size must not exceed n_fft ({self.n_fft})")
        if not 0.0 <= self.fmin < self.max_frequency <= self.sampling_rate / 2:
            raise ValueError(
                f"ReferenceMelConfig: need 0 <= fmin ({self.fmin}) < fmax ({self.max_frequency}) <= "
                f"sampling_rate / 2 ({self.sampling_rate / 2})"
            )

    @property
    def max_frequency(self) -> float:
        return self.sampling_rate / 2 if self.fmax is None else self.fmax

    @property
    def pad(self) -> int:
        """Reflect padding on each side, so that frame t is centred on sample t * hop + hop / 2."""
        return (self.n_fft - self.hop_size) // 2

    @classmethod
    def from_vocoder_config(cls, h: Mapping[str, Any]) -> ReferenceMelConfig:
        """From the zero-shot .mar's config.json (the keys its handler passes to the mel)."""
        if "fmax" not in h:
            raise ValueError("vocoder config: missing 'fmax'")
        return cls(
            sampling_rate=_config_int(h, "sampling_rate"),
            n_fft=_config_int(h, "n_fft"),
            hop_size=_config_int(h, "hop_size"),
            win_size=_config_int(h, "win_size"),
            num_mels=_config_int(h, "num_mels"),
            fmin=_config_float(h, "fmin"),
            fmax=None if h["fmax"] is None else _config_float(h, "fmax"),
        )


def reference_mel(wave: np.ndarray, sample_rate: int, config: ReferenceMelConfig) -> torch.Tensor:
    """A reference recording (float samples, (N,) or (channels, N), at sample_rate) -> the
    (1, num_mels, T) float32 log-mel the speaker encoder takes, as the reference makes it."""
    samples = np.asarray(wave)
    if not np.issubdtype(samples.dtype, np.floating):
        raise ValueError(f"reference audio must be float samples, got {samples.dtype}")
    if samples.ndim == 2:
        samples = samples.mean(axis=0)  # librosa's to_mono: the plain mean of the channels
    elif samples.ndim != 1:
        raise ValueError(f"reference audio must be (N,) or (channels, N), got shape {samples.shape}")
    samples = samples.astype(np.float32)
    if not np.all(np.isfinite(samples)):
        raise ValueError("reference audio has non-finite samples")
    if sample_rate != config.sampling_rate:
        samples = resample(samples, sample_rate, config.sampling_rate)
    need = max(config.pad + 1, config.n_fft - 2 * config.pad)
    if samples.shape[0] < need:
        raise ValueError(
            f"reference audio is too short: {samples.shape[0]} samples at {config.sampling_rate} Hz, need {need}"
        )
    if not np.any(samples):
        raise ValueError("reference audio is silent")
    samples = normalise_level(highpass(samples, config.sampling_rate))
    return log_mel(torch.from_numpy(samples).unsqueeze(0), config)


def resample(samples: npt.NDArray[np.float32], src_rate: int, dst_rate: int) -> npt.NDArray[np.float32]:
    """Mono float32 samples from src_rate to dst_rate with FFmpeg's swresample (via PyAV)."""
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples)[None, :], format="flt", layout="mono")
    frame.sample_rate = src_rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=dst_rate)
    chunks = [out.to_ndarray()[0] for out in resampler.resample(frame)]
    chunks += [out.to_ndarray()[0] for out in resampler.resample(None)]  # flush the filter's delay line
    return np.concatenate(chunks).astype(np.float32, copy=False) if chunks else np.zeros(0, np.float32)


def highpass_coefficients(sample_rate: int, cutoff: float = _HIGHPASS_HZ) -> tuple[np.ndarray, np.ndarray]:
    """(b, a) of the 2nd-order Butterworth high-pass that scipy.signal.butter(2, cutoff,
    "highpass", fs=sample_rate) designs: the bilinear transform with the cutoff prewarped."""
    k = math.tan(math.pi * cutoff / sample_rate)
    norm = 1.0 / (1.0 + math.sqrt(2.0) * k + k * k)
    b = np.array([norm, -2.0 * norm, norm])
    a = np.array([1.0, 2.0 * (k * k - 1.0) * norm, (1.0 - math.sqrt(2.0) * k + k * k) * norm])
    return b, a


def highpass(samples: npt.NDArray[np.float32], sample_rate: int) -> npt.NDArray[np.float32]:
    """The 70 Hz high-pass, run forward once from a zero state (scipy's sosfilt, not filtfilt),
    in float64, returned as float32 as the reference does."""
    b, a = highpass_coefficients(sample_rate)
    return _biquad(samples.astype(np.float64), b, a).astype(np.float32)


def _biquad(x: npt.NDArray[np.float64], b: np.ndarray, a: np.ndarray) -> npt.NDArray[np.float64]:
    """y = lfilter(b, a, x) from a zero state, block by block instead of sample by sample.

    Transposed direct form II as a state space: s' = A s + B x, y = C s + D x with
    A = [[-a1, 1], [-a2, 0]], B = [b1 - a1 b0, b2 - a2 b0], C = [1, 0], D = b0. Within a block
    of L samples starting in state s, y[k] = C A^k s + sum_{j<=k} h[k - j] x[j] (h the impulse
    response) and the block ends in A^L s + sum_j A^(L-1-j) B x[j]. The input terms of all
    blocks are two matrix products; only the 2-number state is carried block to block.
    """
    n = x.shape[0]
    size = _HIGHPASS_BLOCK
    blocks = -(-n // size)
    xb = np.zeros(blocks * size)
    xb[:n] = x
    xb = xb.reshape(blocks, size)  # (blocks, L)
    a_mat = np.array([[-a[1], 1.0], [-a[2], 0.0]])
    b_vec = np.array([b[1] - a[1] * b[0], b[2] - a[2] * b[0]])
    powers = np.empty((size + 1, 2, 2))  # A^0 .. A^L
    powers[0] = np.eye(2)
    for k in range(size):
        powers[k + 1] = a_mat @ powers[k]
    state_to_out = powers[:size, 0, :]  # (L, 2): row k = C A^k
    impulse = np.concatenate(([b[0]], state_to_out[: size - 1] @ b_vec))  # h[0] = D, h[m] = C A^(m-1) B
    rows, cols = np.indices((size, size))
    toeplitz = np.where(rows >= cols, impulse[np.clip(rows - cols, 0, size - 1)], 0.0)  # (L, L): h[k - j]
    input_to_state = (powers[size - 1 :: -1] @ b_vec).T  # (2, L): column j = A^(L-1-j) B
    y = xb @ toeplitz.T  # (blocks, L), from a zero state
    driven = xb @ input_to_state.T  # (blocks, 2): each block's input carried to its end
    starts = np.zeros((blocks, 2))
    for i in range(1, blocks):
        starts[i] = powers[size] @ starts[i - 1] + driven[i - 1]
    y += starts @ state_to_out.T
    return y.reshape(-1)[:n]


def normalise_level(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Scale to -26 dBFS RMS, or less where that would push the peak past 1."""
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    peak = float(np.max(np.abs(samples)))
    if rms == 0.0:
        raise ValueError("reference audio is silent after the high-pass filter")
    gain = min(_VOLUME_LEVEL / rms, 1.0 / peak)
    return samples * np.float32(gain)


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (librosa's default, htk=False): linear to 1 kHz, logarithmic above."""
    mel = hz / (200.0 / 3.0)
    log_part = hz >= 1000.0
    return np.where(log_part, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (math.log(6.4) / 27.0), mel)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = mel * (200.0 / 3.0)
    return np.where(mel >= 15.0, 1000.0 * np.exp((math.log(6.4) / 27.0) * (mel - 15.0)), hz)


def slaney_mel_filters(config: ReferenceMelConfig) -> torch.Tensor:
    """(num_mels, n_fft // 2 + 1) float32 triangles, equally spaced on Slaney's mel scale from
    fmin to fmax, each scaled by 2 / (its bandwidth in Hz): librosa.filters.mel's defaults."""
    fft_freqs = np.fft.rfftfreq(config.n_fft, d=1.0 / config.sampling_rate)
    edges = _mel_to_hz(
        np.linspace(
            _hz_to_mel(np.array(config.fmin)), _hz_to_mel(np.array(config.max_frequency)), config.num_mels + 2
        )
    )  # (num_mels + 2,) Hz
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_freqs[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return torch.from_numpy(weights.astype(np.float32))


def log_mel(samples: torch.Tensor, config: ReferenceMelConfig) -> torch.Tensor:
    """(B, N) float32 samples -> (B, num_mels, T) BigVGAN-style natural-log mel,
    T = (N + 2 * pad - n_fft) // hop + 1."""
    padded = F.pad(samples.unsqueeze(1), (config.pad, config.pad), mode="reflect").squeeze(1)
    window = torch.hann_window(config.win_size, dtype=samples.dtype, device=samples.device)
    spec = torch.stft(
        padded,
        config.n_fft,
        hop_length=config.hop_size,
        win_length=config.win_size,
        window=window,
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )  # (B, n_fft // 2 + 1, T)
    magnitude = torch.sqrt(spec.real.square() + spec.imag.square() + _MAGNITUDE_EPS)
    mel = slaney_mel_filters(config).to(magnitude) @ magnitude  # (B, num_mels, T)
    return torch.log(mel.clamp(min=_LOG_FLOOR))
