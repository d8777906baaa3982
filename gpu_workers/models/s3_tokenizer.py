"""CosyVoice2's speech tokenizer (S3TokenizerV2): 16 kHz mono audio -> discrete units, 25 a second.

The published HyperCLOVAX-SEED-Omni checkpoint holds it under `model.discrete_audio_model.`; with
that prefix stripped, its key names are this module's state_dict names. Per clip:

    waveform, cut into 80 s pieces when longer than 80 s (the reference's cut; each piece alone)
      -> log-mel of the piece (STFT n_fft 400, hop 160, Hann, centred with reflect padding,
         last frame dropped; Slaney mel filters; log10(max(., 1e-10)); max(x, piece max - 8);
         (x + 4) / 4)                                                   (n_mels, T)  100 a second
      -> gelu(conv1, stride 2) -> gelu(conv2, stride 2)                 (T/4, width)  25 a second
      -> n_layer blocks: x + attn(attn_ln(x)); x + mlp(mlp_ln(x))       no final norm
           attn = out(softmax(rope(q) rope(k)^T / 8) v) + fsmn(v)
           fsmn(v) = depthwise conv31(v) + v, over v with padding zeroed (v before RoPE)
      -> project_down (float32) -> tanh -> x 0.999 -> round -> +1       (T/4, D) digits in {0,1,2}
      -> code = sum_i digit_i * 3**i, dimension 0 least significant      in [0, 3**D)

and a clip's codes are its pieces' codes, concatenated. RoPE restarts at position 0 in every
piece (rotate-half layout, head_dim 64, theta 10000; 80 s is 2000 positions). Lengths, for a
piece of n samples:

    mel frames  T0 = n // 160                    the centred STFT has n // 160 + 1; the last goes
    conv1       T1 = (T0 - 1) // 2 + 1           kernel 3, stride 2, padding 1
    conv2       T2 = (T1 - 1) // 2 + 1           = codes of the piece

Batching: pieces of every clip go through the encoder together, zero-padded to the longest of
a batch. That is exact: conv inputs are zeroed past each piece's length (as the unpadded conv's
own zero padding), attention masks padded keys, FSMN zeroes padded v, the rest is per position.

A piece shorter than MIN_PIECE_SAMPLES cannot be reflect-padded by torch.stft (the reference
fails on it). A whole clip that short is refused; a long clip's tail piece that short (at most
12.5 ms, at most one code) is dropped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.models.hf_weights import load_exact

MODEL_TYPE = "s3_tokenizer_v2"
SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
PIECE_SAMPLES = 80 * SAMPLE_RATE  # the reference's cut for long clips
MIN_PIECE_SAMPLES = N_FFT // 2 + 1  # torch.stft's reflect padding (200) must be shorter than the piece
HEAD_DIM = 64  # the reference's RoPE table is built for 64 whatever the width
ROPE_THETA = 10000.0
FSMN_KERNEL = 31
FSQ_SCALE = 0.9990000128746033  # float32(0.999), as the reference writes it
LOG_FLOOR = 1e-10
DYNAMIC_RANGE = 8.0
ATTN_LN_EPS = 1e-6  # the reference's attn_ln; mlp_ln keeps nn.LayerNorm's 1e-5
MLP_LN_EPS = 1e-5
# Padded encoder positions per forward (rows x longest): four 80 s pieces. Bounds the CPU
# attention's (B, H, T, T) scores and the MLP's activations when many clips come at once.
MAX_BATCH_POSITIONS = 4 * 2000

_BLOCK = re.compile(r"^encoder\.blocks\.(\d+)\.")


@dataclass(frozen=True, slots=True)
class S3TokenizerV2Config:
    n_mels: int = 128
    n_state: int = 1280  # width
    n_head: int = 20
    n_layer: int = 6
    fsq_dims: int = 8  # project_down's rows; each a base-3 digit of the code

    def __post_init__(self) -> None:
        if min(self.n_mels, self.n_state, self.n_head, self.n_layer, self.fsq_dims) <= 0:
            raise ValueError(f"S3 tokenizer: sizes must be positive, got {self}")
        if self.n_mels > N_FFT // 2 + 1:
            raise ValueError(f"S3 tokenizer: at most {N_FFT // 2 + 1} mel bins for n_fft {N_FFT}, got {self.n_mels}")
        if self.n_state != self.n_head * HEAD_DIM:
            raise ValueError(
                f"S3 tokenizer: width {self.n_state} with {self.n_head} heads is not head_dim {HEAD_DIM}, "
                "which the reference's RoPE table fixes"
            )

    @property
    def num_codes(self) -> int:
        return 3**self.fsq_dims

    @classmethod
    def from_state_dict_shapes(cls, shapes: Mapping[str, tuple[int, ...]]) -> S3TokenizerV2Config:
        """Sizes from tensor shapes under the prefix-stripped names; heads = width // 64."""
        for key in ("encoder.conv1.weight", "quantizer._codebook.project_down.weight"):
            if key not in shapes:
                raise ValueError(f"S3 tokenizer weights: no {key}")
        conv1 = tuple(shapes["encoder.conv1.weight"])  # (width, n_mels, 3)
        down = tuple(shapes["quantizer._codebook.project_down.weight"])  # (D, width)
        if len(conv1) != 3 or len(down) != 2:
            raise ValueError(f"S3 tokenizer weights: conv1 {conv1}, project_down {down} have the wrong rank")
        width, n_mels = conv1[0], conv1[1]
        if width % HEAD_DIM:
            raise ValueError(f"S3 tokenizer: width {width} is not a multiple of head_dim {HEAD_DIM}")
        blocks = {int(m.group(1)) for key in shapes if (m := _BLOCK.match(key))}
        if blocks != set(range(len(blocks))):
            raise ValueError(f"S3 tokenizer weights: blocks {sorted(blocks)} are not 0..n-1")
        return cls(n_mels=n_mels, n_state=width, n_head=width // HEAD_DIM, n_layer=len(blocks), fsq_dims=down[0])


# ---------------------------------------------------------------------------------------------
# Log-mel


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    # Slaney: linear below 1 kHz (200/3 Hz a mel), logarithmic above, as librosa (htk=False)
    mels = hz / (200.0 / 3)
    log = hz >= 1000.0
    mels[log] = 15.0 + np.log(hz[log] / 1000.0) / (np.log(6.4) / 27.0)
    return mels


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    hz = (200.0 / 3) * mels
    log = mels >= 15.0
    hz[log] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mels[log] - 15.0))
    return hz


def slaney_mel_filters(n_mels: int) -> np.ndarray:
    """(n_mels, 201) float32 Slaney-normalised triangles over 0..8 kHz for n_fft 400 at 16 kHz:
    librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels) to the bit, rounding included
    (the triangles are stored as float32 before the float64 area factor is applied)."""
    fft_hz = np.fft.rfftfreq(N_FFT, 1.0 / SAMPLE_RATE)  # (201,)
    edges = _mel_to_hz(np.linspace(0.0, _hz_to_mel(np.array([SAMPLE_RATE / 2]))[0], n_mels + 2))
    widths = np.diff(edges)
    slopes = edges[:, None] - fft_hz[None, :]  # (M+2, F): filter m rises on [m, m+1], falls on [m+1, m+2]
    tri = np.maximum(0.0, np.minimum(-slopes[:-2] / widths[:-1, None], slopes[2:] / widths[1:, None]))
    filters = tri.astype(np.float32)
    filters *= 2.0 / (edges[2:] - edges[:-2])[:, None]  # equal area per filter
    return filters


def log_mel(wave: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """(n,) float32 piece -> (n_mels, n // 160); the dynamic-range floor from this piece alone."""
    window = torch.hann_window(N_FFT, device=wave.device)
    stft = torch.stft(wave, N_FFT, HOP_LENGTH, window=window, return_complex=True)  # (201, n // 160 + 1)
    power = stft[..., :-1].abs() ** 2
    spec = torch.clamp(filters @ power, min=LOG_FLOOR).log10()
    spec = torch.maximum(spec, spec.max() - DYNAMIC_RANGE)
    return (spec + 4.0) / 4.0


def conv_lengths(mel_frames: int) -> int:
    """Codes for a piece of mel_frames frames: two stride-2 convs (kernel 3, padding 1)."""
    t1 = (mel_frames - 1) // 2 + 1
    return (t1 - 1) // 2 + 1


def split_pieces(num_samples: int) -> list[tuple[int, int]]:
    """[start, end) sample ranges of a clip's pieces: 80 s each, the last shorter; a tail too
    short to reflect-pad is dropped (see the module docstring)."""
    if num_samples < MIN_PIECE_SAMPLES:
        raise ValueError(
            f"audio of {num_samples} samples is too short for the S3 tokenizer's STFT "
            f"(at least {MIN_PIECE_SAMPLES} samples at {SAMPLE_RATE} Hz)"
        )
    pieces = [(s, min(s + PIECE_SAMPLES, num_samples)) for s in range(0, num_samples, PIECE_SAMPLES)]
    return [(s, e) for s, e in pieces if e - s >= MIN_PIECE_SAMPLES]


# ---------------------------------------------------------------------------------------------
# Modules


def _layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    # in float32 whatever the model's dtype, as the reference's LayerNorm
    w = norm.weight.float() if norm.weight is not None else None
    b = norm.bias.float() if norm.bias is not None else None
    return F.layer_norm(x.float(), norm.normalized_shape, w, b, norm.eps).to(x.dtype)


def rope_tables(num_positions: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (T, 64), each half repeated (rotate-half layout), computed as the reference does."""
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
    angles = torch.outer(torch.arange(num_positions, device=device).float(), inv_freq)  # (T, 32)
    rot = torch.view_as_real(torch.polar(torch.ones_like(angles), angles))  # (T, 32, 2)
    cos = torch.cat((rot[..., 0], rot[..., 0]), dim=-1)
    sin = torch.cat((rot[..., 1], rot[..., 1]), dim=-1)
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, 64); cos, sin (T, 64)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class FSMNAttention(nn.Module):
    """Self-attention with RoPE on q and k, plus a depthwise-conv memory over v."""

    def __init__(self, config: S3TokenizerV2Config) -> None:
        super().__init__()
        d = config.n_state
        self.n_head = config.n_head
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d, bias=False)
        self.value = nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.fsmn_block = nn.Conv1d(d, d, FSMN_KERNEL, groups=d, padding=FSMN_KERNEL // 2, bias=False)

    def forward(
        self, x: torch.Tensor, keep: torch.Tensor, attn_mask: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """x (B, T, d); keep (B, T, 1) 1 on real positions; attn_mask (B, 1, 1, T) bool or None."""
        b, t, d = x.shape
        q = self.query(x).view(b, t, self.n_head, HEAD_DIM)
        k = self.key(x).view(b, t, self.n_head, HEAD_DIM)
        v = self.value(x)  # (B, T, d)

        v_kept = v * keep  # zero past the piece, as the unpadded conv's own padding
        memory = (self.fsmn_block(v_kept.transpose(1, 2)).transpose(1, 2) + v_kept) * keep

        # q and k each take head_dim**-0.25, as the reference splits the 1/8 between them
        scale = HEAD_DIM**-0.25
        q = (apply_rope(q, cos, sin) * scale).transpose(1, 2)  # (B, H, T, 64)
        k = (apply_rope(k, cos, sin) * scale).transpose(1, 2)
        v_heads = v.view(b, t, self.n_head, HEAD_DIM).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q, k, v_heads, attn_mask=attn_mask, scale=1.0)  # (B, H, T, 64)
        return self.out(attn.transpose(1, 2).reshape(b, t, d)) + memory


class ResidualBlock(nn.Module):
    def __init__(self, config: S3TokenizerV2Config) -> None:
        super().__init__()
        d = config.n_state
        self.attn = FSMNAttention(config)
        self.attn_ln = nn.LayerNorm(d, eps=ATTN_LN_EPS)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.mlp_ln = nn.LayerNorm(d, eps=MLP_LN_EPS)

    def forward(
        self, x: torch.Tensor, keep: torch.Tensor, attn_mask: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.attn(_layer_norm(self.attn_ln, x), keep, attn_mask, cos, sin)
        return x + self.mlp(_layer_norm(self.mlp_ln, x))


def _keep(lengths: torch.Tensor, size: int) -> torch.Tensor:
    """(B, size) bool, True on positions [0, length) of each row."""
    return torch.arange(size, device=lengths.device)[None, :] < lengths[:, None]


class AudioEncoderV2(nn.Module):
    def __init__(self, config: S3TokenizerV2Config) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(config.n_mels, config.n_state, 3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(config.n_state, config.n_state, 3, stride=2, padding=1)
        self.blocks = nn.ModuleList(ResidualBlock(config) for _ in range(config.n_layer))

    def forward(self, mel: torch.Tensor, mel_frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """mel (B, n_mels, T0) zero past each row's mel_frames (B,) -> (B, T2, d), lengths (B,)."""
        x = F.gelu(self.conv1(mel))  # (B, d, T1)
        lengths = (mel_frames - 1) // 2 + 1
        x = x * _keep(lengths, x.shape[-1])[:, None, :].to(x.dtype)  # conv2 must see zeros past each row
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # (B, T2, d)
        lengths = (lengths - 1) // 2 + 1
        keep = _keep(lengths, x.shape[1])  # (B, T2)
        padded = bool((lengths < x.shape[1]).any())
        attn_mask = keep[:, None, None, :] if padded else None  # None lets SDPA take its fastest kernel
        cos, sin = rope_tables(x.shape[1], x.device, x.dtype)
        keep_x = keep[..., None].to(x.dtype)
        for block in self.blocks:
            x = block(x, keep_x, attn_mask, cos, sin)
        return x, lengths


class FSQCodebook(nn.Module):
    def __init__(self, config: S3TokenizerV2Config) -> None:
        super().__init__()
        self.project_down = nn.Linear(config.n_state, config.fsq_dims)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (...) int64 codes; in float32 whatever the encoder's dtype, since a bf16
        z would move codes across rounding edges."""
        w, b = self.project_down.weight.float(), self.project_down.bias.float()
        z = F.linear(hidden.float(), w, b)  # (..., D)
        digits = torch.round(torch.tanh(z) * FSQ_SCALE).long() + 1  # (..., D) in {0, 1, 2}
        powers = 3 ** torch.arange(z.shape[-1], device=z.device)  # dimension 0 least significant
        return (digits * powers).sum(-1)


class FSQQuantizer(nn.Module):
    """Holds the codebook under `_codebook`, the reference's key path."""

    def __init__(self, config: S3TokenizerV2Config) -> None:
        super().__init__()
        self._codebook = FSQCodebook(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._codebook(hidden)


# ---------------------------------------------------------------------------------------------
# The tokenizer


class S3TokenizerV2(nn.Module):
    mel_filters: torch.Tensor  # (n_mels, 201) float32, a buffer that is not in the state dict

    def __init__(self, config: S3TokenizerV2Config) -> None:
        super().__init__()
        self.config = config
        self.encoder = AudioEncoderV2(config)
        self.quantizer = FSQQuantizer(config)
        self.register_buffer("mel_filters", torch.from_numpy(slaney_mel_filters(config.n_mels)), persistent=False)

    def forward(self, mel: torch.Tensor, mel_frames: torch.Tensor) -> list[torch.Tensor]:
        """mel (B, n_mels, T0) float32 zero-padded, mel_frames (B,) -> each row's codes (int64)."""
        dtype = self.encoder.conv1.weight.dtype
        hidden, lengths = self.encoder(mel.to(dtype), mel_frames)
        codes = self.quantizer(hidden)  # (B, T2)
        return [row[:n] for row, n in zip(codes, lengths.tolist(), strict=True)]

    @torch.inference_mode()
    def encode(self, waves: Sequence[np.ndarray]) -> list[np.ndarray]:
        """16 kHz mono float32 clips -> each clip's int64 codes, 25 a second. Pieces of all clips
        go through the encoder in batches of at most MAX_BATCH_POSITIONS padded positions."""
        device = self.mel_filters.device
        filters = self.mel_filters.to(torch.float32)
        mels: list[torch.Tensor] = []  # one per piece, in clip order
        pieces_per_clip: list[int] = []
        for wave in waves:
            samples = torch.as_tensor(np.asarray(wave, dtype=np.float32)).to(device)
            if samples.dim() != 1:
                raise ValueError(f"audio clip must be a 1-D waveform, got shape {tuple(samples.shape)}")
            spans = split_pieces(samples.numel())
            mels.extend(log_mel(samples[s:e], filters) for s, e in spans)
            pieces_per_clip.append(len(spans))

        codes: list[torch.Tensor | None] = [None] * len(mels)
        for batch in self._batches([m.shape[-1] for m in mels]):
            frames = torch.tensor([mels[i].shape[-1] for i in batch], device=device)
            padded = torch.zeros(len(batch), self.config.n_mels, int(frames.max()), device=device)
            for row, i in enumerate(batch):
                padded[row, :, : mels[i].shape[-1]] = mels[i]
            for i, row_codes in zip(batch, self(padded, frames), strict=True):
                codes[i] = row_codes

        out: list[np.ndarray] = []
        start = 0
        for n in pieces_per_clip:
            parts = [c for c in codes[start : start + n] if c is not None]
            out.append(torch.cat(parts).cpu().numpy().astype(np.int64))
            start += n
        return out

    @staticmethod
    def _batches(mel_frames: list[int]) -> list[list[int]]:
        """Piece indices grouped longest first, each group's rows x longest within the budget."""
        order = sorted(range(len(mel_frames)), key=lambda i: -mel_frames[i])
        groups: list[list[int]] = []
        for i in order:
            if groups and (len(groups[-1]) + 1) * conv_lengths(mel_frames[groups[-1][0]]) <= MAX_BATCH_POSITIONS:
                groups[-1].append(i)
            else:
                groups.append([i])
        return groups

    def load_reference_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Strict: every key of the reference's names (prefix stripped), of the right shape."""
        load_exact(self, state_dict, "S3 tokenizer")

    @classmethod
    def from_reference_state_dict(
        cls,
        state_dict: Mapping[str, torch.Tensor],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> S3TokenizerV2:
        """Sizes from the shapes; the encoder in dtype, project_down kept in float32."""
        config = S3TokenizerV2Config.from_state_dict_shapes({k: tuple(t.shape) for k, t in state_dict.items()})
        # built on meta: no memory or time spent on a random init that the weights overwrite
        with torch.device("meta"):
            model = cls(config)
        model.encoder.to(dtype)
        model = model.to_empty(device=device)
        model.mel_filters.copy_(torch.from_numpy(slaney_mel_filters(config.n_mels)))  # to_empty left it undefined
        model.load_reference_state_dict(state_dict)
        return model.eval()


# ---------------------------------------------------------------------------------------------
# Random weights for tests and tiny checkpoints


_CONV1_GAIN = 4.0  # with it, z before tanh has std ~2 on speech-like audio: every digit's three levels occur


def random_reference_state_dict(config: S3TokenizerV2Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic float32 weights under the reference's (prefix-stripped) names, scaled so
    codes vary over time and use all three levels of every digit on speech-like audio."""
    with torch.device("meta"):
        shapes = {name: tuple(t.shape) for name, t in S3TokenizerV2(config).state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in sorted(shapes.items()):
        noise = torch.randn(shape, generator=gen)
        if "_ln." in name and name.endswith("weight"):
            out[name] = 1.0 + 0.1 * noise  # near one, not one, so a missed norm shows
        elif name.endswith("bias"):
            out[name] = 0.1 * noise
        else:
            out[name] = noise / math.sqrt(math.prod(shape[1:]))  # keeps activations about unit size
    # The log-mel's overall level barely moves within a clip: zero-mean conv1 filters ignore it,
    # so frames differ by what they hear, and a gain brings its small swings to unit size.
    conv1 = out["encoder.conv1.weight"]
    out["encoder.conv1.weight"] = _CONV1_GAIN * (conv1 - conv1.mean(dim=(1, 2), keepdim=True))
    return out
