#!/usr/bin/env python3
"""How much the unit vocoder's audio loses in bfloat16 and float16 (review B1, issue 22 point 5).

SNR (dB) of the audio the vocoder gives in a low precision against the same vocoder in float32:
10 log10(sum ref^2 / sum (ref - low)^2), over --seconds of random units for two voices, at two
widths with seeded random weights (random weights are what we have; a trained vocoder's
signal is smoother, its error no smaller):

  tiny       the embedded default checkpoint's vocoder (64 channels)
  reference  UnitVocoderConfig()'s BigVGAN-v2 24 kHz widths (1536 channels)

The whole model is cast, as `--dtype` casts it (the Kaiser-sinc resampler's taps included;
its convolutions take one dtype, so the taps cannot stay float32 alone). This is not a
timing: it may run beside other work. On the CPU it takes a minute (the reference width);
--device cuda measures the GPU's kernels.

    .venv/bin/python bench/vocoder_dtype.py
    .venv/bin/python bench/vocoder_dtype.py --device cuda --widths tiny reference
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_workers.models.unit_vocoder import UnitVocoder, UnitVocoderConfig, random_unit_vocoder  # noqa: E402
from gpu_workers.tiny.checkpoints import TINY_VOCODER, TINY_VOICES  # noqa: E402

WIDTHS = {
    "tiny": UnitVocoderConfig.from_dict({**TINY_VOCODER, "num_units": 81, "num_speakers": len(TINY_VOICES)}),
    "reference": UnitVocoderConfig(),
}


def snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    reference, other = reference.double(), other.double()
    noise = float(((reference - other) ** 2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float((reference**2).sum()) / noise)


def measure(width: str, seconds: float, device: str, seed: int) -> list[tuple[str, float]]:
    config = WIDTHS[width]
    fp32 = random_unit_vocoder(config, seed, device)
    generator = torch.Generator().manual_seed(seed)
    units = torch.randint(0, config.num_units, (2, round(seconds * config.units_per_second)), generator=generator)
    units = units.to(device)
    with torch.no_grad():  # not inference_mode: the models cache their kernels by version
        speaker = fp32.speaker_embed(torch.zeros(2, dtype=torch.long, device=device))
        reference = fp32(units, speaker).float()
        rows = []
        for dtype in (torch.bfloat16, torch.float16):
            low = random_unit_vocoder(config, seed, device, dtype)
            audio = low(units, speaker.to(dtype)).float()
            rows.append((str(dtype).removeprefix("torch."), snr_db(reference, audio)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", nargs="+", default=list(WIDTHS), choices=list(WIDTHS))
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"| width | dtype | SNR vs float32 (dB) |  ({args.device}, {args.seconds:g} s, 2 voices)")
    print("|---|---|---|")
    for width in args.widths:
        for dtype, snr in measure(width, args.seconds, args.device, args.seed):
            print(f"| {width} | {dtype} | {snr:.1f} |", flush=True)


if __name__ == "__main__":
    main()
