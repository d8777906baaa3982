"""Reading the published audio decoder's archives (decoder/audio/*.mar) into UnitBigVgan
generators, and writing them for tiny checkpoints (gpu_workers/models/unit_bigvgan.py has the
model and what the archives hold).
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_workers.models.hf_weights import load_exact
from gpu_workers.models.unit_bigvgan import (  # the private names: the reference's buffers, rebuilt
    _AA_RATIO,
    _AA_TAPS,
    CONFIG_FILE,
    MANIFEST,
    NAMED_VOICES_ARCHIVE,
    SPEAKER_LIST,
    ZERO_SHOT_ARCHIVE,
    Activation1d,
    UnitBigVgan,
    UnitBigVganConfig,
    _Conv,
    _Up,
    kaiser_sinc_filter,
)

# ---------------------------------------------------------------------------------------------
# Reading the archives.


def fold_weight_norm(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weight-normed pairs (g, v) -> `weight` = g * v / ||v||, the norm over every dim but 0
    (for a ConvTranspose1d, dim 0 is the input channel). Both spellings: the old API's
    `X.weight_g` / `X.weight_v` and the parametrization's `X.parametrizations.weight.original0`
    / `original1`. Every other entry passes unchanged."""
    pairs = {".weight_g": ".weight_v", ".parametrizations.weight.original0": ".parametrizations.weight.original1"}
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for name, tensor in state.items():
        for g_suffix, v_suffix in pairs.items():
            if name.endswith(g_suffix):
                base = name[: -len(g_suffix)]
                v_name = base + v_suffix
                if v_name not in state:
                    raise ValueError(f"weight norm: {name} without {v_name}")
                v = state[v_name].float()
                # torch's own kernel for the fold, so that the result is the weight_norm module's
                out[base + ".weight"] = torch._weight_norm(v, tensor.float(), 0).to(state[v_name].dtype)
                used.update((name, v_name))
    for name, tensor in state.items():
        if name in used:
            continue
        if name.endswith((".weight_v", ".parametrizations.weight.original1")):
            raise ValueError(f"weight norm: {name} without its g")
        out[name] = tensor
    return out


@dataclass(frozen=True, slots=True)
class Archive:
    """One .mar, read: its config.json, the generator's state dict as stored, spk_list.txt."""

    path: Path
    config: dict[str, Any]
    generator: dict[str, torch.Tensor]
    speakers: tuple[str, ...] | None


def read_archive(path: Path) -> Archive:
    """The manifest's serialized file loaded with weights_only=True (no code runs), ["generator"]."""
    try:
        with zipfile.ZipFile(path) as mar:
            names = set(mar.namelist())

            def text(name: str) -> str:
                if name not in names:
                    raise ValueError(f"{path}: no {name} in the archive")
                return mar.read(name).decode("utf-8")

            manifest = json.loads(text(MANIFEST))
            serialized = manifest.get("model", {}).get("serializedFile") if isinstance(manifest, dict) else None
            if not isinstance(serialized, str) or serialized not in names:
                raise ValueError(f"{path}: {MANIFEST} names no serialized file in the archive ({serialized!r})")
            config = json.loads(text(CONFIG_FILE))
            speakers = None
            if SPEAKER_LIST in names:
                speakers = tuple(line.strip() for line in text(SPEAKER_LIST).splitlines())
                while speakers and not speakers[-1]:
                    speakers = speakers[:-1]
            checkpoint = torch.load(io.BytesIO(mar.read(serialized)), map_location="cpu", weights_only=True)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{path}: not a zip archive ({exc})") from None
    generator = checkpoint.get("generator") if isinstance(checkpoint, dict) else None
    if not isinstance(generator, dict) or not all(isinstance(t, torch.Tensor) for t in generator.values()):
        raise ValueError(f"{path}: the serialized file holds no {{'generator': state dict}}")
    if not isinstance(config, dict):
        raise ValueError(f"{path}: {CONFIG_FILE} is not a JSON object")  # noqa: TRY004
    return Archive(path, config, generator, speakers)


_DROPPED = (".pad_buffer",)  # the reference's streaming buffers (zeros): not weights
_FILTERS = (".upsample.filter", ".downsample.lowpass.filter")


def load_generator(
    config: UnitBigVganConfig, state: Mapping[str, torch.Tensor], what: str,
    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
) -> UnitBigVgan:  # fmt: skip
    """The generator's own weights (spk_emb.* of a zero-shot archive is not its: left out),
    weight norm folded; the stored resampling filters must be the computed ones."""
    folded = fold_weight_norm(state)
    weights: dict[str, torch.Tensor] = {}
    expected_filter = kaiser_sinc_filter(0.5 / _AA_RATIO, 0.6 / _AA_RATIO, _AA_TAPS)
    for name, tensor in folded.items():
        if name.endswith(_DROPPED) or (not config.finetune and name.startswith("spk_emb.")):
            continue
        if name.endswith(_FILTERS):
            stored = tensor.detach().float().reshape(-1)
            if stored.shape != expected_filter.shape or not torch.allclose(stored, expected_filter, atol=1e-6, rtol=0):
                raise ValueError(f"{what}: {name} is not the Kaiser-sinc filter the reference computes")
            continue
        weights[name] = tensor.to(dtype)
    model = UnitBigVgan(config)
    load_exact(model, weights, what)
    return model.to(device=device, dtype=dtype).requires_grad_(False).eval()


@dataclass(frozen=True, slots=True)
class NamedVoices:
    generator: UnitBigVgan
    voices: tuple[str, ...]  # row i of generator.spk_emb is voices[i]


@dataclass(frozen=True, slots=True)
class ZeroShot:
    generator: UnitBigVgan
    encoder: nn.Module  # ecapa_tdnn.EcapaTdnn: (B, num_mels, T) -> (B, spk_emb_dim)
    mel_config: Any  # ecapa_tdnn.ReferenceMelConfig
    sample_rate: int  # the reference recording's rate (config.json's sampling_rate)


@dataclass(frozen=True, slots=True)
class PublishedAudioDecoder:
    """decoder/audio/, loaded: one or both generators."""

    named: NamedVoices | None
    zero_shot: ZeroShot | None

    @property
    def generators(self) -> list[UnitBigVgan]:
        return [g.generator for g in (self.named, self.zero_shot) if g is not None]

    @property
    def config(self) -> UnitBigVganConfig:
        return self.generators[0].config

    @property
    def voices(self) -> tuple[str, ...]:
        return self.named.voices if self.named is not None else ()


def is_published_audio_decoder(directory: str | Path) -> bool:
    return any(Path(directory).glob("*.mar"))


def load_published_audio_decoder(
    directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> PublishedAudioDecoder:
    directory = Path(directory)
    named_path, zs_path = directory / NAMED_VOICES_ARCHIVE, directory / ZERO_SHOT_ARCHIVE
    if not named_path.is_file() and not zs_path.is_file():
        raise ValueError(f"{directory}: neither {NAMED_VOICES_ARCHIVE} nor {ZERO_SHOT_ARCHIVE}")
    named = _load_named(read_archive(named_path), device, dtype) if named_path.is_file() else None
    zero_shot = _load_zero_shot(read_archive(zs_path), device, dtype) if zs_path.is_file() else None
    decoder = PublishedAudioDecoder(named, zero_shot)
    shapes = {(g.config.num_units, g.config.hop) for g in decoder.generators}
    if len(shapes) != 1:
        raise ValueError(f"{directory}: the two generators disagree on (num_units, hop): {sorted(shapes)}")
    return decoder


def _load_named(archive: Archive, device: str | torch.device, dtype: torch.dtype) -> NamedVoices:
    config = UnitBigVganConfig.from_reference(archive.config)
    if not config.finetune:
        raise ValueError(f"{archive.path}: finetune is not true: not a named-voice generator")
    voices = archive.speakers
    if voices is None:
        raise ValueError(f"{archive.path}: no {SPEAKER_LIST}")
    if not voices or any(not v for v in voices) or len(set(voices)) != len(voices) or len(voices) > config.num_spk:
        raise ValueError(
            f"{archive.path}: {SPEAKER_LIST} must name up to num_spk ({config.num_spk}) distinct voices, one a line"
        )
    return NamedVoices(load_generator(config, archive.generator, f"{archive.path.name} generator", device, dtype), voices)


def _load_zero_shot(archive: Archive, device: str | torch.device, dtype: torch.dtype) -> ZeroShot:
    from gpu_workers.models import ecapa_tdnn  # only a zero-shot archive needs it

    config = UnitBigVganConfig.from_reference(archive.config)
    if config.finetune:
        raise ValueError(f"{archive.path}: finetune is true: not a zero-shot generator")
    generator = load_generator(config, archive.generator, f"{archive.path.name} generator", device, dtype)
    prefix = "spk_emb."
    encoder_state = {n[len(prefix) :]: t for n, t in archive.generator.items() if n.startswith(prefix)}
    encoder = ecapa_tdnn.EcapaTdnn(ecapa_tdnn.EcapaConfig.from_vocoder_config(archive.config))
    encoder.load_reference_state_dict(encoder_state)
    encoder = encoder.to(device=device, dtype=dtype).requires_grad_(False).eval()
    rate = archive.config.get("sampling_rate")
    if not isinstance(rate, int) or isinstance(rate, bool) or rate <= 0:
        raise ValueError(f"{archive.path}: sampling_rate must be a positive int, got {rate!r}")
    mel_config = ecapa_tdnn.ReferenceMelConfig.from_vocoder_config(archive.config)
    return ZeroShot(generator, encoder, mel_config, rate)


# ---------------------------------------------------------------------------------------------
# Random weights (tests, the tiny checkpoint).


def random_generator_state(config: UnitBigVganConfig, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights under the folded names, whose output is neither silent nor clipped:
    std gain / sqrt(fan_in), each AMP branch's last conv and conv_post at gain 0.3 (a residual
    stream that does not grow threefold per block), SnakeBeta's logs near 0, conv_post's taps
    centred per channel (no DC from sin^2's offset)."""
    gen = torch.Generator().manual_seed(seed)
    model = UnitBigVgan(config)
    out: dict[str, torch.Tensor] = {}
    for name, param in sorted(model.named_parameters()):
        noise = torch.randn(param.shape, generator=gen)
        if name.endswith((".alpha", ".beta")):
            value = (0.0 if config.snake_logscale else 1.0) + 0.1 * noise
        elif name.endswith(".bias"):
            value = 0.02 * noise
        elif name.startswith(("unit_emb.", "spk_emb.")):
            value = noise
        else:
            fan_in = float(math.prod(param.shape[1:]))
            if ".deconv." in name:
                fan_in = param.shape[0] * param.shape[2] / config.upsample_rates[int(name.split(".")[1])]
            gain = 0.3 if (".convs2." in name or name.startswith("conv_post.")) else 1.0
            value = noise * (gain / math.sqrt(fan_in))
        out[name] = value
    post = out["conv_post.conv.weight"]
    out["conv_post.conv.weight"] = post - post.mean(dim=-1, keepdim=True)
    return out


def unfold_weight_norm(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of fold_weight_norm for the reference's convolutions (tiny archives):
    each conv/deconv weight -> weight_g = ||w|| over every dim but 0, weight_v = w."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith((".conv.weight", ".deconv.weight")):
            base = name[: -len(".weight")]
            norm = tensor.flatten(1).norm(dim=1).view(-1, *([1] * (tensor.dim() - 1)))
            out[base + ".weight_g"], out[base + ".weight_v"] = norm, tensor.clone()
        else:
            out[name] = tensor
    return out


def reference_buffers(config: UnitBigVganConfig) -> dict[str, torch.Tensor]:
    """The buffers the reference saves beside the weights (tiny archives): each resampler's
    filter (1, 1, K) and, with causal convs, each conv's and transposed conv's pad_buffer
    (zeros, (1, C_in, its left padding))."""
    with torch.device("meta"):
        model = UnitBigVgan(config)
    taps = kaiser_sinc_filter(0.5 / _AA_RATIO, 0.6 / _AA_RATIO, _AA_TAPS).view(1, 1, -1)
    out: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, Activation1d):
            out[f"{name}.upsample.filter"] = taps.clone()
            out[f"{name}.downsample.lowpass.filter"] = taps.clone()
        elif config.causal and isinstance(module, _Conv):
            out[f"{name}.pad_buffer"] = torch.zeros(1, module.conv.in_channels, module.padding[0])
        elif config.causal and isinstance(module, _Up):
            out[f"{name}.pad_buffer"] = torch.zeros(1, module.deconv.in_channels, module.left)
    return out
