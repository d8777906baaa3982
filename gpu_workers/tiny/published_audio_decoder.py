"""A tiny decoder/audio/ in the published layout: the two TorchServe archives, byte for byte
the same for the same arguments.

Each .mar is a zip of MAR-INF/MANIFEST.json (naming the serialized file), config.json (the
reference's keys, at a tiny width but the real hop: 960 samples a unit at 24 kHz), the
serialized file {"generator": state dict} in the reference's names with weight norm as g/v
pairs, and, for the named voices, spk_list.txt.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import torch

SERIALIZED_FILE = "unit_bigvgan.pt"  # the real name is the manifest's; any name works
_ZIP_TIME = (2025, 1, 1, 0, 0, 0)  # fixed, so that the archives are reproducible

TINY_GENERATOR: dict[str, Any] = {
    "resblock": "1",
    "activation": "snakebeta",
    "snake_logscale": True,
    "causal": True,
    "use_bias_at_final": True,
    "use_tanh_at_final": True,
    "unit_emb_dim": 32,
    "spk_emb_dim": 16,
    "upsample_rates": [8, 5, 4, 3, 2],  # 960 samples a unit: 25 units a second at 24 kHz
    "upsample_kernel_sizes": [16, 10, 8, 6, 4],
    "upsample_initial_channel": 64,
    "resblock_kernel_sizes": [3, 7],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]],
    "sampling_rate": 24000,
}
# the zero-shot archive's speaker encoder (ECAPA-TDNN) and the reference recording's mel
TINY_ZERO_SHOT: dict[str, Any] = {
    "num_mels": 20,
    "spk_hidden_dim": 16,
    "global_context_att": True,
    "n_fft": 1024,
    "hop_size": 256,
    "win_size": 1024,
    "fmin": 0,
    "fmax": 12000,
}


def make_tiny_published_audio_decoder(out_dir: Path, *, seed: int, num_units: int, voices: tuple[str, ...]) -> Path:
    """out_dir/NCCosybigvganDecoder.mar and out_dir/NCZSCosybigvganDecoder.mar, random weights
    (seed) whose audio is neither silent nor clipped."""
    from gpu_workers.models import ecapa_tdnn
    from gpu_workers.models.unit_bigvgan import NAMED_VOICES_ARCHIVE, ZERO_SHOT_ARCHIVE, UnitBigVganConfig
    from gpu_workers.models.unit_bigvgan_archive import random_generator_state, reference_buffers, unfold_weight_norm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    named = {**TINY_GENERATOR, "num_units": num_units, "finetune": True, "num_spk": len(voices)}
    config = UnitBigVganConfig.from_reference(named)
    state = {**unfold_weight_norm(random_generator_state(config, seed)), **reference_buffers(config)}
    _write_archive(out_dir / NAMED_VOICES_ARCHIVE, named, state, "".join(f"{v}\n" for v in voices))

    zero_shot = {**TINY_GENERATOR, **TINY_ZERO_SHOT, "num_units": num_units, "finetune": False}
    config = UnitBigVganConfig.from_reference(zero_shot)
    state = {**unfold_weight_norm(random_generator_state(config, seed + 1)), **reference_buffers(config)}
    encoder = ecapa_tdnn.random_reference_state_dict(ecapa_tdnn.EcapaConfig.from_vocoder_config(zero_shot), seed + 2)
    state.update({f"spk_emb.{name}": tensor for name, tensor in sorted(encoder.items())})
    _write_archive(out_dir / ZERO_SHOT_ARCHIVE, zero_shot, state, None)
    return out_dir


def _write_archive(path: Path, config: dict[str, Any], state: dict[str, torch.Tensor], speakers: str | None) -> None:
    weights = io.BytesIO()
    torch.save({"generator": {name: t.contiguous() for name, t in state.items()}}, weights)
    manifest = {
        "runtime": "python",
        "model": {"modelName": path.stem, "serializedFile": SERIALIZED_FILE, "modelVersion": "1.0"},
        "archiverVersion": "0.12.0",
    }
    files = {
        "MAR-INF/MANIFEST.json": json.dumps(manifest, indent=2).encode(),
        "config.json": json.dumps(config, indent=2, sort_keys=True).encode(),
        SERIALIZED_FILE: weights.getvalue(),
    }
    if speakers is not None:
        files["spk_list.txt"] = speakers.encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as mar:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, _ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            mar.writestr(info, data)
