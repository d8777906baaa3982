"""A BigVGAN-style causal unit vocoder: the audio decoder's model (audio units in, 24 kHz out).

One call, for T units of a batch of B requests (hop = prod(upsample_rates) = 960 samples per
unit at 24 kHz and 25 units per second):

    units (B, T) -> unit_embed / sqrt(unit_embed_dim)     (B, E, T)
    speaker (B, S), broadcast over time, concatenated      (B, E + S, T)
    conv_pre  (causal, kernel 7)                           (B, C0, T)
    stage i: ups[i]  (causal transposed conv, stride u_i)  (B, C0 / 2^(i+1), T * u_0 * ... * u_i)
             mean of the stage's AMP blocks (one per resblock kernel size)
    activation_post (anti-aliased SnakeBeta), conv_post    (B, 1, T * hop)
    tanh                                                   (B, T * hop) audio in [-1, 1]

An AMP block (BigVGAN's AMPBlock1) is, for each dilation d of its kernel k,
x <- x + conv_k(act(conv_{k,d}(act(x)))), every act an Activation1d: 2x upsampling through a
Kaiser-windowed sinc low-pass filter, SnakeBeta (x + 1/b * sin^2(a x), a and b per channel,
stored as logs when snake_logscale), then 2x low-pass downsampling (the alias-free resampling
of StyleGAN3 as BigVGAN uses it, arXiv 2206.04658).

Causal and streaming. Every layer that looks at the past (each convolution, transposed
convolution and resampling filter) is causal: its output at time t reads inputs up to t only,
and it keeps its left context, the last L samples of its input, in the request's
VocoderState. A call runs each such layer on [context | new input] and leaves the context
for the next call, so T units always give exactly T * hop samples, with no lookahead and no
overlap to add, and decoding in chunks computes what decoding at once computes. A fresh state
is zeros: the model hears silence before the first unit.

    layer                               context L (input samples)   output of [context | x]
    CausalConv1d k, dilation d          (k - 1) * d                 all of it (valid conv)
    CausalConvTranspose1d k, stride u   ceil(k / u) - 1             T * u, u phases of T
    UpSample1d (ratio r, taps K)        ceil(K / r) - 1             T * r, r phases of T
    DownSample1d (ratio r, taps K)      K - r (at the upsampled rate)  all of it, stride r

Batching: rows may hold different numbers of valid units (right-padded). Causality keeps the
padding from reaching valid samples; outputs past a row's length are garbage to drop, and
each row's next context is gathered at that row's own valid end (Stream.extend), so a row of a
batch continues exactly as it would alone.

Exactness. In float32 on the CPU every convolution goes through oneDNN (_conv1d), whose
results depend neither on the length nor on the batch size; the transposed convolutions are
computed as ordinary ones, one per output phase, for that reason. So chunked decoding, for any
chunking, equals one-shot decoding bit for bit (torch.equal), and a row decoded in a batch
equals the row decoded alone. (F.conv1d left to itself switches kernels with the input's size
for a batch of one, which broke both by float rounding, about 1e-7.) On a GPU, cuDNN may pick
kernels by shape too: there only closeness is promised.

Against BigVGAN (non-causal: symmetric padding, replicate padding in the resamplers), away
from the edges each causal piece equals BigVGAN's delayed by a fixed lag:

    CausalConv1d k, d                   (k - 1) * d / 2         (k odd, BigVGAN's get_padding)
    CausalConvTranspose1d k, u          (k - u) // 2 output samples (BigVGAN's padding)
    UpSample1d                          (K - r) // 2 output samples (5 for r 2, K 12)
    Activation1d                        ((K - r) // 2 + (K - r) - (K // 2 - 1 + K % 2)) / r input
                                        samples: 5 for r 2, K 12 (the down filter's causal
                                        window ends on the last upsampled sample of its frame)

An AMP block is not a delayed BigVGAN block: its residual adds x undelayed to the causal
branch (a causal model is trained so); stage by stage it is x + branch(x) delayed by
5 + (k - 1) * d / 2 + 5 + (k - 1) / 2. tests/gpu_workers/models/test_unit_vocoder.py checks each
of these against alias-free-torch (the resampling code BigVGAN adopted) and a non-causal
reference written from the paper.

Weights are BigVGAN's names with weight norm folded in (inference only): conv_pre.weight,
ups.{i}.weight (ConvTranspose1d layout (C_in, C_out, k); BigVGAN's ups.{i}.0), resblocks.{n}
(n = i * num_kernels + j).convs1/convs2.{s}.weight, .activations.{2s, 2s + 1}.act.alpha/beta,
activation_post.act.alpha/beta, conv_post.weight, plus unit_embed.weight and
speaker_embed.weight (the named voices' table). The filters are not weights: they follow from
the config (BigVGAN's stored *.filter buffers are the same numbers and are dropped).

The checkpoint's audio_decoder/ directory (load_unit_vocoder):

    config.json                   UnitVocoderConfig.to_dict(), with an optional
                                  "speaker_encoder" section (SpeakerEncoderConfig)
    model.safetensors             the vocoder, speaker table included
    speakers.json                 {"speakers": [name, ...]}: row i of speaker_embed is voice i
    speaker_encoder.safetensors   when the config has a speaker_encoder section
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from gpu_workers.models.checkpoint_io import read_json
from gpu_workers.models.hf_weights import load_exact
from gpu_workers.preprocess.audio import AudioFeatureConfig, LogMelExtractor
from omni.shared.settings import json_key, read_json_config, to_json_config

MODEL_TYPE = "omni_unit_vocoder"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SPEAKERS_FILE = "speakers.json"
SPEAKER_ENCODER_FILE = "speaker_encoder.safetensors"
_EDGE_KERNEL = 7  # conv_pre and conv_post, as BigVGAN
_SNAKE_EPS = 1e-9  # BigVGAN's no_div_by_zero


# config.json readers of the fields below, refusing a value of the wrong kind by name
def _as_tuple(name: str, value: object) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"unit vocoder config: {name} must be a list, got {value!r}")
    return tuple(value)


def _as_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"unit vocoder config: {name} must be a number, got {value!r}")
    return float(value)


def _as_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"unit vocoder config: {name} must be true or false, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class SpeakerEncoderConfig:
    """A reference recording -> a speaker embedding (the zero-shot voice)."""

    sample_rate: int = 16000  # the recording is resampled to this before it is given
    num_mel_bins: int = 80
    channels: int = 512
    kernel_size: int = 5
    num_layers: int = 3
    max_seconds: int = 30  # only the first max_seconds of a recording are read

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_positive_int(f"speaker_encoder.{f.name}", getattr(self, f.name))
        AudioFeatureConfig(num_mel_bins=self.num_mel_bins, sampling_rate=self.sample_rate)  # raises when unusable

    @property
    def min_samples(self) -> int:
        return AudioFeatureConfig().n_fft  # one STFT window

    @property
    def max_samples(self) -> int:
        return self.max_seconds * self.sample_rate


class UpsampleStages:
    """What a BigVGAN-style generator's stages derive from its config (both unit vocoders')."""

    __slots__ = ()
    upsample_rates: tuple[int, ...]
    upsample_initial_channel: int
    resblock_kernel_sizes: tuple[int, ...]

    @property
    def hop(self) -> int:
        return math.prod(self.upsample_rates)

    @property
    def num_kernels(self) -> int:
        return len(self.resblock_kernel_sizes)

    def stage_channels(self, i: int) -> int:
        """Channels after upsampling stage i (stage -1: conv_pre's output)."""
        return self.upsample_initial_channel // 2 ** (i + 1)

    def stage_rate(self, i: int) -> int:
        """Samples per unit after upsampling stage i (1 before the first)."""
        return math.prod(self.upsample_rates[: i + 1])


@dataclass(frozen=True, slots=True)
class UnitVocoderConfig(UpsampleStages):
    """Defaults: the reference's sizes where known (6,561 units, 24 kHz, 25 units a second),
    BigVGAN-v2 24 kHz's widths and AMP kernels, upsampling stages rearranged for hop 960."""

    num_units: int = 6561
    unit_embed_dim: int = 512
    num_speakers: int = 1
    speaker_embed_dim: int = 192
    sample_rate: int = 24000
    units_per_second: int = 25
    upsample_rates: tuple[int, ...] = json_key((5, 4, 4, 3, 2, 2), read=_as_tuple)
    upsample_kernel_sizes: tuple[int, ...] = json_key((10, 8, 8, 6, 4, 4), read=_as_tuple)
    upsample_initial_channel: int = 1536
    resblock_kernel_sizes: tuple[int, ...] = json_key((3, 7, 11), read=_as_tuple)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = json_key(
        ((1, 3, 5), (1, 3, 5), (1, 3, 5)), read=lambda key, v: tuple(_as_tuple(key, d) for d in _as_tuple(key, v))
    )
    snake_logscale: bool = json_key(True, read=_as_bool)
    # the anti-aliased activation's resampling: BigVGAN's ratio 2, 12 taps, cutoff 0.5 / ratio,
    # half width 0.6 / ratio; the Kaiser window's beta follows from half width and taps
    antialias_ratio: int = 2
    antialias_kernel_size: int = 12
    antialias_cutoff: float = json_key(0.25, read=_as_float)
    antialias_half_width: float = json_key(0.3, read=_as_float)
    use_bias_at_final: bool = json_key(True, read=_as_bool)  # conv_post's bias (BigVGAN-v2 has none)
    speaker_encoder: SpeakerEncoderConfig | None = json_key(
        None, read=lambda key, v: _speaker_encoder_config(v), write=lambda v: None if v is None else to_json_config(v)
    )

    def __post_init__(self) -> None:
        for name in ("num_units", "unit_embed_dim", "num_speakers", "speaker_embed_dim", "sample_rate",
                     "units_per_second", "upsample_initial_channel", "antialias_kernel_size"):  # fmt: skip
            _check_positive_int(name, getattr(self, name))
        rates, kernels = self.upsample_rates, self.upsample_kernel_sizes
        _check_int_tuple("upsample_rates", rates)
        _check_int_tuple("upsample_kernel_sizes", kernels)
        if len(kernels) != len(rates) or any(k < u for k, u in zip(kernels, rates, strict=True)):
            raise ValueError(
                f"unit vocoder config: upsample_kernel_sizes {list(kernels)} must pair with upsample_rates "
                f"{list(rates)}, each kernel at least its rate"
            )
        if self.sample_rate % self.units_per_second or self.hop != self.sample_rate // self.units_per_second:
            raise ValueError(
                f"unit vocoder config: upsample_rates {list(rates)} multiply to {self.hop}, want "
                f"{self.sample_rate / self.units_per_second:g} samples per unit (sample_rate {self.sample_rate} / "
                f"units_per_second {self.units_per_second})"
            )
        if self.upsample_initial_channel % 2 ** len(rates):
            raise ValueError(
                f"unit vocoder config: upsample_initial_channel {self.upsample_initial_channel} must halve "
                f"{len(rates)} times (a multiple of {2 ** len(rates)})"
            )
        _check_int_tuple("resblock_kernel_sizes", self.resblock_kernel_sizes)
        dilations = self.resblock_dilation_sizes
        if len(dilations) != len(self.resblock_kernel_sizes):
            raise ValueError(
                f"unit vocoder config: resblock_dilation_sizes has {len(dilations)} lists, want one per "
                f"resblock_kernel_sizes ({len(self.resblock_kernel_sizes)})"
            )
        for d in dilations:
            _check_int_tuple("resblock_dilation_sizes", d)
        ratio = self.antialias_ratio
        if not isinstance(ratio, int) or isinstance(ratio, bool) or ratio < 2:
            raise ValueError(f"unit vocoder config: antialias_ratio must be an int >= 2, got {ratio!r}")
        if self.antialias_kernel_size < 2 * ratio:
            raise ValueError(
                f"unit vocoder config: antialias_kernel_size {self.antialias_kernel_size} must be at least "
                f"2 * antialias_ratio ({2 * ratio})"
            )
        if not 0 < self.antialias_cutoff <= 0.5:
            raise ValueError(f"unit vocoder config: antialias_cutoff must be in (0, 0.5], got {self.antialias_cutoff}")
        if not self.antialias_half_width > 0:
            raise ValueError(
                f"unit vocoder config: antialias_half_width must be positive, got {self.antialias_half_width}"
            )


    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> UnitVocoderConfig:
        """Our config.json: every key optional (a missing one takes its default), unknown keys
        refused so that a misspelt one is not silently ignored."""
        if isinstance(raw, Mapping) and raw.get("model_type", MODEL_TYPE) != MODEL_TYPE:
            raise ValueError(f"unit vocoder config: model_type {raw['model_type']!r} is not {MODEL_TYPE}")
        return read_json_config(cls, raw, what="unit vocoder config", ignore=frozenset({"model_type"}))

    def to_dict(self) -> dict[str, Any]:
        out = to_json_config(self, model_type=MODEL_TYPE)
        if out["speaker_encoder"] is None:
            del out["speaker_encoder"]
        return out


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"unit vocoder config: {name} must be a positive int, got {value!r}")


def _check_int_tuple(name: str, value: tuple[int, ...]) -> None:
    if not value or any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in value):
        raise ValueError(f"unit vocoder config: {name} must be a non-empty list of positive ints, got {value!r}")




def _speaker_encoder_config(value: object) -> SpeakerEncoderConfig | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"unit vocoder config: speaker_encoder must be an object, got {value!r}")
    known = {f.name for f in fields(SpeakerEncoderConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"unit vocoder config: unknown speaker_encoder keys {unknown}")
    return SpeakerEncoderConfig(**value)


# ---------------------------------------------------------------------------------------------
# The carried state, and one call's view of it.


@dataclass(frozen=True, slots=True)
class VocoderState:
    """Every causal layer's left context for a batch of requests: the layer's name in the
    model -> (B, C, L), its last L input samples. A row is one request."""

    contexts: dict[str, torch.Tensor]

    @property
    def batch_size(self) -> int:
        return next(iter(self.contexts.values())).shape[0]

    def split(self) -> list[VocoderState]:
        """One state per row (copies: a row's state does not pin the batch's memory)."""
        return [
            VocoderState({name: c[i : i + 1].clone() for name, c in self.contexts.items()})
            for i in range(self.batch_size)
        ]

    @classmethod
    def stack(cls, states: Sequence[VocoderState]) -> VocoderState:
        """States of rows (or of batches) in order -> one batch state."""
        if not states:
            raise ValueError("no vocoder states to stack")
        names = states[0].contexts.keys()
        if any(s.contexts.keys() != names for s in states):
            raise ValueError("vocoder states of different models cannot be stacked")
        return cls({name: torch.cat([s.contexts[name] for s in states]) for name in names})


class Stream:
    """One decode call over a VocoderState: each causal layer reads its context here and
    leaves the next one, cut at every row's valid end.

    lengths (B,): valid units per row (None: all T). A layer at `rate` input samples per unit
    sees row b valid over [0, lengths[b] * rate) of its new input; its next context is then the
    L samples of [context | input] that end there:

        full     |<- context L ->|<-- input: valid lengths[b] * rate -->|<- padding ->|
        next                     [valid ... valid + L)   (indices into full)
    """

    def __init__(self, state: VocoderState, lengths: torch.Tensor | None) -> None:
        self.old = state.contexts
        self.new: dict[str, torch.Tensor] = {}
        self.lengths = lengths

    def extend(self, name: str, x: torch.Tensor, rate: int) -> torch.Tensor:
        """[context | x] (B, C, L + T_in) for the layer `name`, whose next context is kept."""
        context = self.old[name]
        full = torch.cat([context, x], dim=-1)
        width = context.shape[-1]
        if self.lengths is None:
            self.new[name] = full[..., full.shape[-1] - width :]
        else:
            start = self.lengths * rate  # (B,)
            index = start[:, None] + torch.arange(width, device=full.device)  # (B, L)
            self.new[name] = full.gather(2, index[:, None, :].expand(-1, full.shape[1], -1))
        return full


# ---------------------------------------------------------------------------------------------
# Modules, small to large.


class CausalLayer(nn.Module):
    """A layer with a left context in the state. `name` is its path in the model, set by
    UnitVocoder once the tree is built; `rate` is its input's samples per unit."""

    def __init__(self, channels: int, context: int, rate: int) -> None:
        super().__init__()
        self.channels = channels
        self.context = context
        self.rate = rate
        self.name = ""


class CausalConv1d(CausalLayer):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, rate: int,
                 dilation: int = 1, bias: bool = True) -> None:  # fmt: skip
        super().__init__(in_channels, (kernel_size - 1) * dilation, rate)
        self.dilation = dilation
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        full = stream.extend(self.name, x, self.rate)  # (B, C_in, L + T)
        return _conv1d(full, self.weight, self.bias, dilation=self.dilation)  # (B, C_out, T)


class CausalConvTranspose1d(CausalLayer):
    """Output sample n reads inputs m with m * stride <= n < m * stride + k: all at or before
    n // stride, so the first T * stride outputs of T inputs are final; the k - stride samples
    past them are recomputed from the next call's context instead of carried as an overlap.

    Computed as `stride` ordinary convolutions, one per output phase (polyphase): output
    m * u + p, for phase p in [0, u), is sum over j of W[:, :, p + j * u] . x[m - j], a causal
    convolution of J = ceil(k / u) taps over [context | x]. The weight keeps ConvTranspose1d's
    layout (C_in, C_out, k); the J-tap kernels are rearranged from it when it changes (a copy
    of the weight: 12M values for the reference's first stage, too many to redo per chunk)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, rate: int) -> None:
        super().__init__(in_channels, -(-kernel_size // stride) - 1, rate)
        self.stride = stride
        self.weight = nn.Parameter(torch.empty(in_channels, out_channels, kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels))
        # (the weights' identity, the kernels made of them): not a buffer, so neither saved nor
        # moved; a new device, dtype or any in-place write (load_state_dict, copy_) misses
        self._phases: tuple[tuple[int, int, int, int], tuple[torch.Tensor, torch.Tensor]] | None = None

    def phase_kernels(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(C_out * u, C_in, J) kernels, row o * u + p for channel o, phase p; the bias per row."""
        w, b = self.weight, self.bias
        key = (w.data_ptr(), w._version, b.data_ptr(), b._version)
        if self._phases is None or self._phases[0] != key:
            self._phases = (key, self._rearrange())
        return self._phases[1]

    def _rearrange(self) -> tuple[torch.Tensor, torch.Tensor]:
        c_in, c_out, k = self.weight.shape
        u, taps = self.stride, self.context + 1
        w = F.pad(self.weight, (0, taps * u - k))  # (C_in, C_out, J * u): zero taps past k
        w = w.view(c_in, c_out, taps, u).permute(1, 3, 0, 2)  # (C_out, u, C_in, J): [o, p, i, j] = W[i, o, p + j*u]
        # tap t of a causal kernel reads x[m - (J - 1 - t)]: j = J - 1 - t
        return w.flip(-1).reshape(c_out * u, c_in, taps), self.bias.repeat_interleave(u)

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        full = stream.extend(self.name, x, self.rate)  # (B, C_in, J - 1 + T)
        weight, bias = self.phase_kernels()
        y = _conv1d(full, weight, bias)  # (B, C_out * u, T)
        return _interleave(y, self.stride)  # (B, C_out, T * u)


def _conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            stride: int = 1, dilation: int = 1, groups: int = 1) -> torch.Tensor:  # fmt: skip
    """F.conv1d with no padding, but on the CPU in float32 always through oneDNN. F.conv1d
    picks PyTorch's own im2col kernels for a batch of one under about 20k input values and
    oneDNN above (and for batches), and the two round differently: a one-unit chunk would
    then not give the samples of a long one. oneDNN's results do not depend on the batch size
    or the length, so chunked, batched and one-shot decoding agree bit for bit."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and torch.backends.mkldnn.is_available():
        return torch.mkldnn_convolution(x, weight.contiguous(), bias, [0], [stride], [dilation], groups)
    return F.conv1d(x, weight, bias, stride=stride, dilation=dilation, groups=groups)


def _interleave(y: torch.Tensor, phases: int) -> torch.Tensor:
    """(B, C * r, T), row c * r + p holding phase p of channel c -> (B, C, T * r)."""
    b, cr, t = y.shape
    return y.view(b, cr // phases, phases, t).transpose(2, 3).reshape(b, cr // phases, t * phases)


def kaiser_sinc_filter(cutoff: float, half_width: float, kernel_size: int) -> torch.Tensor:
    """(kernel_size,) float32 low-pass taps summing to 1: a sinc of the cutoff (in cycles per
    sample) under a Kaiser window whose beta meets the transition half width, the taps centred
    between samples for an even size (the alias-free GAN's filter, as BigVGAN builds it)."""
    half = kernel_size // 2
    # Kaiser's design formulas: the attenuation (dB) a window of this length reaches over a
    # transition of width 2 * half_width each side, then the beta that gives it
    attenuation = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(kernel_size, periodic=False, beta=beta, dtype=torch.float32, device="cpu")
    times = torch.arange(kernel_size, dtype=torch.float32, device="cpu") - (kernel_size - 1) / 2
    taps = 2 * cutoff * window * torch.sinc(2 * cutoff * times)
    return taps / taps.sum()  # a constant passes unchanged


class _Resampler(CausalLayer):
    """Holds the filter, and the per-channel kernels made of it, as buffers computed from the
    config, not weights."""

    filter: torch.Tensor  # (K,)
    kernels: torch.Tensor  # what _conv1d takes, (C * phases, 1, taps)

    def __init__(self, channels: int, context: int, rate: int, config: UnitVocoderConfig) -> None:
        super().__init__(channels, context, rate)
        self.ratio = config.antialias_ratio
        self._design = (config.antialias_cutoff, config.antialias_half_width, config.antialias_kernel_size)
        taps = kaiser_sinc_filter(*self._design)
        self.register_buffer("filter", taps, persistent=False)
        self.register_buffer("kernels", self._kernels(taps), persistent=False)

    def _kernels(self, taps: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def reset_filter(self) -> None:
        """Recompute the buffers (after to_empty leaves them uninitialised)."""
        taps = kaiser_sinc_filter(*self._design)
        with torch.no_grad():
            self.filter.copy_(taps)
            self.kernels.copy_(self._kernels(taps))


class UpSample1d(_Resampler):
    """ratio * the transposed convolution of x with the filter (zeros between samples, then
    low-pass), causal, computed per output phase as CausalConvTranspose1d is: phase p of
    output m is ratio * sum over j of filter[p + j * ratio] * x[m - j]."""

    def __init__(self, channels: int, rate: int, config: UnitVocoderConfig) -> None:
        ratio, taps = config.antialias_ratio, config.antialias_kernel_size
        super().__init__(channels, -(-taps // ratio) - 1, rate, config)

    def _kernels(self, taps: torch.Tensor) -> torch.Tensor:
        r, j = self.ratio, self.context + 1
        phases = F.pad(taps, (0, j * r - taps.numel())).view(j, r).t().flip(-1)  # (r, J): [p, t] = f[p + (J-1-t)*r]
        return phases.repeat(self.channels, 1)[:, None, :].contiguous()  # (C * r, 1, J): row c * r + p is phase p

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        full = stream.extend(self.name, x, self.rate)  # (B, C, J - 1 + T)
        y = self.ratio * _conv1d(full, self.kernels, groups=self.channels)  # (B, C * r, T)
        return _interleave(y, self.ratio)  # (B, C, T * r)


class DownSample1d(_Resampler):
    def __init__(self, channels: int, rate: int, config: UnitVocoderConfig) -> None:
        # the window of output i ends on input r * i + r - 1, the last sample of its frame
        super().__init__(channels, config.antialias_kernel_size - config.antialias_ratio, rate, config)

    def _kernels(self, taps: torch.Tensor) -> torch.Tensor:
        return taps.repeat(self.channels, 1)[:, None, :].contiguous()  # (C, 1, K): one per channel

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        full = stream.extend(self.name, x, self.rate)  # (B, C, L + r * T)
        return _conv1d(full, self.kernels, stride=self.ratio, groups=self.channels)  # (B, C, T)


class SnakeBeta(nn.Module):
    """x + 1 / b * sin^2(a x) per channel; a and b stored as logs when logscale."""

    def __init__(self, channels: int, logscale: bool) -> None:
        super().__init__()
        self.logscale = logscale
        self.alpha = nn.Parameter(torch.empty(channels))
        self.beta = nn.Parameter(torch.empty(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha[None, :, None]  # (1, C, 1)
        beta = self.beta[None, :, None]
        if self.logscale:
            alpha, beta = alpha.exp(), beta.exp()
        return x + (1.0 / (beta + _SNAKE_EPS)) * torch.sin(x * alpha).pow(2)


class Activation1d(nn.Module):
    """SnakeBeta at twice the rate: upsample, activate, low-pass and downsample, so that the
    harmonics the activation makes above the band do not fold back into it."""

    def __init__(self, channels: int, rate: int, config: UnitVocoderConfig) -> None:
        super().__init__()
        self.upsample = UpSample1d(channels, rate, config)
        self.act = SnakeBeta(channels, config.snake_logscale)
        self.downsample = DownSample1d(channels, rate * config.antialias_ratio, config)

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        return self.downsample(self.act(self.upsample(x, stream)), stream)  # (B, C, T)


class AMPBlock(nn.Module):
    """BigVGAN's AMPBlock1: per dilation d, x + conv_k(act(conv_{k,d}(act(x))))."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...], rate: int,
                 config: UnitVocoderConfig) -> None:  # fmt: skip
        super().__init__()
        self.convs1 = nn.ModuleList(CausalConv1d(channels, channels, kernel_size, rate, d) for d in dilations)
        self.convs2 = nn.ModuleList(CausalConv1d(channels, channels, kernel_size, rate) for _ in dilations)
        self.activations = nn.ModuleList(Activation1d(channels, rate, config) for _ in range(2 * len(dilations)))

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        acts = list(self.activations)
        for conv1, conv2, act1, act2 in zip(self.convs1, self.convs2, acts[::2], acts[1::2], strict=True):
            x = x + conv2(act2(conv1(act1(x, stream), stream), stream), stream)
        return x  # (B, C, T)


class UnitVocoder(nn.Module):
    """The generator and the named voices' speaker table. The streaming API:

        init_state(batch)                                  -> VocoderState of zeros
        decode_chunk(units (B, T), speaker (B, S), state, lengths (B,) | None)
                                                           -> audio (B, T * hop), next state
        forward(units, speaker)                            -> audio: decode_chunk from a fresh state
        speaker_embedding(voices (B,))                     -> (B, S) rows of the table

    `speaker` is an embedding vector per row: a table row or a SpeakerEncoder's output.
    """

    def __init__(self, config: UnitVocoderConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.unit_embed = nn.Embedding(c.num_units, c.unit_embed_dim)
        self.speaker_embed = nn.Embedding(c.num_speakers, c.speaker_embed_dim)
        self.conv_pre = CausalConv1d(c.unit_embed_dim + c.speaker_embed_dim, c.upsample_initial_channel,
                                     _EDGE_KERNEL, rate=1)  # fmt: skip
        self.ups = nn.ModuleList(
            CausalConvTranspose1d(c.stage_channels(i - 1), c.stage_channels(i), k, u, rate=c.stage_rate(i - 1))
            for i, (u, k) in enumerate(zip(c.upsample_rates, c.upsample_kernel_sizes, strict=True))
        )
        self.resblocks = nn.ModuleList(
            AMPBlock(c.stage_channels(i), k, d, c.stage_rate(i), c)
            for i in range(len(c.upsample_rates))
            for k, d in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes, strict=True)
        )
        last = c.stage_channels(len(c.upsample_rates) - 1)
        self.activation_post = Activation1d(last, c.hop, c)
        self.conv_post = CausalConv1d(last, 1, _EDGE_KERNEL, rate=c.hop, bias=c.use_bias_at_final)
        # a plain list (not registered twice): every layer the state holds a context for
        self._causal: list[CausalLayer] = []
        for name, module in self.named_modules():
            if isinstance(module, CausalLayer):
                module.name = name
                self._causal.append(module)

    @classmethod
    def empty(
        cls, config: UnitVocoderConfig, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> UnitVocoder:
        """Parameters allocated, not initialised (built on meta: no time spent on an init that
        weights overwrite); the filters computed. Load weights or call init_random_ next."""
        with torch.device("meta"):
            model = cls(config)
        model = model.to_empty(device=device)
        for module in model.modules():
            if isinstance(module, _Resampler):
                module.reset_filter()
        return model.to(dtype).requires_grad_(False).eval()

    def init_state(self, batch: int, device: torch.device | str | None = None,
                   dtype: torch.dtype | None = None) -> VocoderState:  # fmt: skip
        weight = self.conv_pre.weight
        device = weight.device if device is None else device
        dtype = weight.dtype if dtype is None else dtype
        return VocoderState({
            m.name: torch.zeros(batch, m.channels, m.context, device=device, dtype=dtype) for m in self._causal
        })  # fmt: skip

    def speaker_embedding(self, voices: torch.Tensor) -> torch.Tensor:
        """voices (B,) indices into the named voices -> (B, speaker_embed_dim)."""
        return self.speaker_embed(voices)

    def forward(self, units: torch.Tensor, speaker: torch.Tensor) -> torch.Tensor:
        audio, _ = self.decode_chunk(units, speaker, self.init_state(units.shape[0]))
        return audio

    def decode_chunk(
        self,
        units: torch.Tensor,
        speaker: torch.Tensor,
        state: VocoderState,
        lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, VocoderState]:
        """units (B, T) long, speaker (B, S), state of batch B, lengths (B,) valid units per
        row (None: all T) -> audio (B, T * hop) (row b valid over [0, lengths[b] * hop)), and
        the state after each row's last valid unit. units and lengths are checked where they
        are, then moved to the model's device: given on the host, the checks read nothing
        back from the device (review C7)."""
        c = self.config
        b, t = self._check_inputs(units, speaker, state, lengths)
        if lengths is not None and bool((lengths == t).all()):
            lengths = None  # every row full: a slice, not a gather, takes the next contexts
        device = self.unit_embed.weight.device
        units = units.to(device)
        stream = Stream(state, None if lengths is None else lengths.to(device))
        x = self.unit_embed(units) * c.unit_embed_dim**-0.5  # (B, T, E)
        voice = speaker.to(x.dtype)[:, :, None].expand(-1, -1, t)  # (B, S, T)
        x = torch.cat([x.transpose(1, 2), voice], dim=1)  # (B, E + S, T)
        x = self.conv_pre(x, stream)  # (B, C0, T)
        k = c.num_kernels
        for i, up in enumerate(self.ups):
            x = up(x, stream)  # (B, C_i, T * stage_rate(i))
            mixed = self.resblocks[i * k](x, stream)
            for j in range(1, k):
                mixed = mixed + self.resblocks[i * k + j](x, stream)
            x = mixed / k
        x = self.conv_post(self.activation_post(x, stream), stream)  # (B, 1, T * hop)
        return torch.tanh(x).squeeze(1), VocoderState(stream.new)

    def _check_inputs(
        self, units: torch.Tensor, speaker: torch.Tensor, state: VocoderState, lengths: torch.Tensor | None
    ) -> tuple[int, int]:
        c = self.config
        if units.dim() != 2 or units.dtype != torch.long:
            raise ValueError(f"units {tuple(units.shape)} {units.dtype}: want (B, T) int64")
        b, t = units.shape
        if speaker.shape != (b, c.speaker_embed_dim):
            raise ValueError(f"speaker {tuple(speaker.shape)}: want ({b}, {c.speaker_embed_dim})")
        if state.batch_size != b:
            raise ValueError(f"state holds {state.batch_size} rows, units {b}")
        if units.numel() and (int(units.min()) < 0 or int(units.max()) >= c.num_units):
            raise ValueError(f"units must be in [0, {c.num_units})")
        if lengths is not None and (lengths.shape != (b,) or bool((lengths < 0).any() | (lengths > t).any())):
            raise ValueError(f"lengths {lengths.tolist()}: want ({b},) values in [0, {t}]")
        return b, t


# ---------------------------------------------------------------------------------------------
# The zero-shot voice: a reference recording -> a speaker embedding.


class SpeakerEncoder(nn.Module):
    """log-mel (the Whisper-style features of gpu_workers/preprocess/audio.py) -> convolutions
    with ReLU -> mean and standard deviation over time -> linear -> speaker_embed_dim."""

    def __init__(self, config: SpeakerEncoderConfig, out_dim: int) -> None:
        super().__init__()
        self.config = config
        c = config
        widths = [c.num_mel_bins] + [c.channels] * c.num_layers
        self.convs = nn.ModuleList(
            nn.Conv1d(i, o, c.kernel_size, padding=c.kernel_size // 2) for i, o in zip(widths, widths[1:], strict=False)
        )
        self.proj = nn.Linear(2 * c.channels, out_dim)
        # on the CPU, whatever the weights' device: a few seconds of audio, cheap there
        self.features = LogMelExtractor(AudioFeatureConfig(num_mel_bins=c.num_mel_bins, sampling_rate=c.sample_rate))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        h = mel  # (B, M, F)
        for conv in self.convs:
            h = F.relu(conv(h))  # (B, C, F)
        stats = torch.cat([h.mean(dim=-1), h.std(dim=-1, correction=0)], dim=-1)  # (B, 2C)
        return self.proj(stats)  # (B, out_dim)

    def embed(self, waveform: torch.Tensor) -> torch.Tensor:
        """A mono recording (N,) at config.sample_rate -> (out_dim,)."""
        c = self.config
        if waveform.dim() != 1 or waveform.numel() < c.min_samples:
            raise ValueError(
                f"reference audio {tuple(waveform.shape)}: want a mono clip of at least {c.min_samples} samples "
                f"({c.min_samples / c.sample_rate * 1000:g} ms at {c.sample_rate} Hz)"
            )
        wave = waveform[: c.max_samples].detach().to("cpu", torch.float32)
        mel = self.features.log_mel(wave[None])  # (1, M, N // hop)
        weight = self.proj.weight
        return self(mel.to(weight.device, weight.dtype))[0]


# ---------------------------------------------------------------------------------------------
# Random weights (tests, the tiny checkpoint, the bench) and loading.


def init_random_(module: nn.Module, seed: int, gains: Mapping[str, float] | None = None) -> None:
    """Seeded noise in sorted-name order, so the same module and seed give the same weights.
    Each weight has std gain / sqrt(fan_in), fan_in the inputs one output sums (a transposed
    convolution's: in_channels * k / stride); embeddings std 1; SnakeBeta's a and b near 1;
    biases small. `gains` multiplies named parameters' std (e.g. a gentler AMP branch)."""
    gen = torch.Generator().manual_seed(seed)
    owners = {
        f"{prefix}.{name}" if prefix else name: (owner, name)
        for prefix, owner in module.named_modules()
        for name, _ in owner.named_parameters(recurse=False)
    }
    for full_name in sorted(owners):
        owner, name = owners[full_name]
        param = getattr(owner, name)
        noise = torch.randn(param.shape, generator=gen)
        gain = (gains or {}).get(full_name, 1.0)
        if isinstance(owner, SnakeBeta):
            value = (0.0 if owner.logscale else 1.0) + 0.1 * noise
        elif name == "bias":
            value = 0.02 * noise
        elif isinstance(owner, nn.Embedding):
            value = gain * noise
        else:
            fan_in = math.prod(param.shape[1:])
            if isinstance(owner, CausalConvTranspose1d):
                fan_in = param.shape[0] * param.shape[2] / owner.stride
            value = noise * (gain / math.sqrt(fan_in))
        with torch.no_grad():
            param.copy_(value)


# A random vocoder's gains: each AMP branch's last convolution at 0.3 keeps the residual stream
# from growing threefold per block (it would saturate tanh after a few stages), and conv_post
# at 0.3 puts the output's RMS near 0.2.
RANDOM_BRANCH_GAIN = 0.3
RANDOM_OUTPUT_GAIN = 0.3


def random_unit_vocoder(
    config: UnitVocoderConfig, seed: int, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> UnitVocoder:
    """A vocoder with seeded random weights whose output is neither silent nor clipped (tests,
    the tiny checkpoint, the bench). conv_post's taps are centred per input channel, so that
    the constant offset SnakeBeta's sin^2 adds to every channel gives no DC in the audio."""
    model = UnitVocoder.empty(config, "cpu", torch.float32)
    gains = {n: RANDOM_BRANCH_GAIN for n, _ in model.named_parameters() if ".convs2." in n and n.endswith(".weight")}
    gains["conv_post.weight"] = RANDOM_OUTPUT_GAIN
    init_random_(model, seed, gains)
    with torch.no_grad():
        post = model.conv_post.weight  # (1, C, 7)
        post.sub_(post.mean(dim=-1, keepdim=True))
    return model.to(device=device, dtype=dtype)


def random_speaker_encoder(
    config: SpeakerEncoderConfig, out_dim: int, seed: int, device: str | torch.device = "cpu"
) -> SpeakerEncoder:
    with torch.device("meta"):
        encoder = SpeakerEncoder(config, out_dim)
    encoder = encoder.to_empty(device="cpu").requires_grad_(False)
    init_random_(encoder, seed)
    return encoder.to(device).eval()


@dataclass(frozen=True, slots=True)
class LoadedVocoder:
    """An audio_decoder/ directory, loaded: the vocoder, its voices in table order, and the
    speaker encoder when the checkpoint has one."""

    vocoder: UnitVocoder
    voices: tuple[str, ...]
    speaker_encoder: SpeakerEncoder | None

    @property
    def config(self) -> UnitVocoderConfig:
        return self.vocoder.config

    def voice_index(self, name: str) -> int:
        try:
            return self.voices.index(name)
        except ValueError:
            raise ValueError(f"unknown voice {name!r}; the voices are {', '.join(self.voices)}") from None

    def voice_embedding(self, name: str) -> torch.Tensor:
        """(speaker_embed_dim,) the named voice's row of the table."""
        index = torch.tensor([self.voice_index(name)], device=self.vocoder.speaker_embed.weight.device)
        return self.vocoder.speaker_embedding(index)[0]


def load_unit_vocoder(
    directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> LoadedVocoder:
    """config.json, model.safetensors, speakers.json and, when the config has a speaker_encoder
    section, speaker_encoder.safetensors; every weight present and of its shape."""
    directory = Path(directory)
    config = UnitVocoderConfig.from_dict(read_json(directory / CONFIG_FILE))
    voices = _read_voices(directory / SPEAKERS_FILE, config.num_speakers)
    vocoder = UnitVocoder.empty(config, device, dtype)
    load_exact(vocoder, _read_weights(directory / WEIGHTS_FILE, device, dtype), "unit vocoder")
    encoder: SpeakerEncoder | None = None
    encoder_path = directory / SPEAKER_ENCODER_FILE
    if config.speaker_encoder is not None:
        with torch.device("meta"):
            encoder = SpeakerEncoder(config.speaker_encoder, config.speaker_embed_dim)
        encoder = encoder.to_empty(device=device).to(dtype).requires_grad_(False)
        load_exact(encoder, _read_weights(encoder_path, device, dtype), "speaker encoder")
        encoder.eval()
    elif encoder_path.is_file():
        raise ValueError(f"{directory}: {SPEAKER_ENCODER_FILE} present but config.json has no speaker_encoder section")
    return LoadedVocoder(vocoder.eval(), voices, encoder)


def _read_weights(path: Path, device: str | torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ValueError(f"{path.parent}: no {path.name}")
    return {name: t.to(dtype) for name, t in load_file(path, device=str(device)).items()}


def _read_voices(path: Path, num_speakers: int) -> tuple[str, ...]:
    voices = read_json(path).get("speakers")
    if (
        not isinstance(voices, list)
        or any(not isinstance(v, str) or not v for v in voices)
        or len(set(voices)) != len(voices)
    ):
        raise ValueError(f"{path}: want {{\"speakers\": [distinct non-empty names]}}")
    if len(voices) != num_speakers:
        raise ValueError(f"{path}: {len(voices)} speakers, but config.json's num_speakers is {num_speakers}")
    return tuple(voices)
