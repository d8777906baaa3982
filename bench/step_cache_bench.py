#!/usr/bin/env python3
"""The image decoder's first-block step cache on CPU: blocks skipped and wall time, by threshold.

Issue 36, acceptance 3: at a threshold that skips about 40% of the DiT's block computations, the
denoising time falls in proportion. The whole decoder runs (gpu_workers/vision_decoder/decoder.py:
noise, condition, every Euler step with its guidance, the VAE, PNG), on a checkpoint of seeded
random weights at the reference width (hidden 1920, 24 heads of 80, RoPE axes 8 | 36 | 36, MLP
7680, a 1536-wide codebook) cut to --depth blocks (the reference has 35), drawing one image of
--size pixels (patch 1, the reference's default: one token per latent pixel; 128: 256 tokens)
in --steps steps. Each --thresholds value draws the same seed; 0 is the cache off.

Reported per threshold: the blocks computed and skipped (every pass of every step), the
denoising seconds (the decoder's mean step time x steps: what the cache can shorten) and the
whole decode's wall seconds. Every threshold is drawn once unmeasured, then --repeats rounds with
the thresholds alternating within each round, so that background load hits them alike; the
minimum is reported (the machine is shared: the minimum is the least disturbed run), with the
median beside it.

Random weights decide nothing about quality: a threshold's skip rate here says how often this
random DiT's first block moves less than it, not what a trained one does (docs/IMAGES.md).

    .venv/bin/python bench/step_cache_bench.py                            # about 6 min on 1 idle core
    .venv/bin/python bench/step_cache_bench.py --depth 2 --steps 4 --repeats 1 --thresholds 0,1  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere, without an install
    sys.path.insert(0, str(ROOT))

from gpu_workers.tiny.checkpoints import make_tiny_vision_decoder
from gpu_workers.vision_decoder.decoder import VisionDecoder
from omni.shared import protocol

REFERENCE_DIT: dict[str, Any] = {  # FluxDiTConfig's defaults, the reference's widths
    "in_channels": 16,
    "hidden_size": 1920,
    "num_heads": 24,
    "mlp_ratio": 4.0,
    "axes_dims_rope": [8, 36, 36],
    "patch": 1,
}
CODEBOOK = (4096, 1536)  # entries (fewer than the reference's 65,536: only the width matters), width
CODE_GRID = 27  # TA-Tok's 27 x 27 codes


def build(root: Path, depth: int, guidance: str, seed: int) -> VisionDecoder:
    codebook = torch.randn(*CODEBOOK, generator=torch.Generator().manual_seed(seed))
    path = make_tiny_vision_decoder(
        root, seed=seed, codebook=codebook, guidance=guidance, code_grid=(CODE_GRID, CODE_GRID),
        dit={**REFERENCE_DIT, "num_layers": depth},
    )  # fmt: skip
    return VisionDecoder.from_dir(path)


def draw(decoder: VisionDecoder, threshold: float, size: int, steps: int, seed: int) -> dict[str, float]:
    codes = torch.randint(0, CODEBOOK[0], (CODE_GRID * CODE_GRID,), generator=torch.Generator().manual_seed(seed))
    job = protocol.ImageJob(1, codes.tolist(), size, size, steps, seed, step_cache=threshold)
    started = time.perf_counter()
    generation = decoder.decode([job])
    wall = time.perf_counter() - started
    image = generation.images[0]
    assert image.error is None, image.error
    return {
        "denoise_s": generation.step_seconds * steps,
        "wall_s": wall,
        "blocks_computed": image.blocks_computed,
        "blocks_skipped": image.blocks_skipped,
    }


def summarize(runs: list[dict[str, float]]) -> dict[str, Any]:
    first = runs[0]
    total = first["blocks_computed"] + first["blocks_skipped"]
    return {
        "blocks_computed": first["blocks_computed"],
        "blocks_skipped": first["blocks_skipped"],
        "skipped_fraction": first["blocks_skipped"] / total,
        "denoise_s_min": min(r["denoise_s"] for r in runs),
        "denoise_s_median": statistics.median(r["denoise_s"] for r in runs),
        "wall_s_min": min(r["wall_s"] for r in runs),
        "denoise_s": [r["denoise_s"] for r in runs],
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    base = results[min(results, key=float)]
    lines = [
        "| threshold | blocks computed | skipped | skipped share | denoising s (min) | median | vs off | computed share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    computed_off = base["blocks_computed"]
    for threshold, r in results.items():
        lines.append(
            f"| {threshold} | {r['blocks_computed']} | {r['blocks_skipped']} | {r['skipped_fraction']:.0%} "
            f"| {r['denoise_s_min']:.2f} | {r['denoise_s_median']:.2f} "
            f"| {r['denoise_s_min'] / base['denoise_s_min']:.2f} | {r['blocks_computed'] / computed_off:.2f} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=6, help="blocks of the main DiT (the reference has 35)")
    ap.add_argument("--size", type=int, default=128, help="image side in pixels (patch 1: (size/8)^2 tokens)")
    ap.add_argument("--steps", type=int, default=12, help="denoising steps (the reference's default is 25)")
    ap.add_argument("--guidance", choices=("none", "autoguidance", "cfg"), default="none",
                    help="none: one DiT pass a step (autoguidance's tiny twin has 1 block, which no cache skips)")
    ap.add_argument("--thresholds", default="0,0.3,0.5,0.7", help="comma-separated; 0 is the cache off")
    ap.add_argument("--repeats", type=int, default=3, help="measured rounds; the minimum is reported")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write a JSON report here")
    return ap  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    thresholds = [t for t in args.thresholds.split(",") if t]
    if not thresholds or any(float(t) < 0 for t in thresholds) or args.repeats < 1:
        raise SystemExit("--thresholds: numbers >= 0; --repeats >= 1")
    torch.set_num_threads(args.threads)
    load = {"start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        decoder = build(Path(tmp) / "decoder", args.depth, args.guidance, args.seed)
        print(f"[step-cache-bench] depth {args.depth} at the reference width, {(args.size // 8) ** 2} tokens, "
              f"{args.steps} steps, guidance {args.guidance}, {args.threads} thread(s); built in "
              f"{time.perf_counter() - t0:.0f} s; load average {load['start']:.2f}", flush=True)  # fmt: skip
        for t in thresholds:  # warm-up: every shape and path once
            draw(decoder, float(t), args.size, args.steps, args.seed)
        runs: dict[str, list[dict[str, float]]] = {t: [] for t in thresholds}
        for round_ in range(args.repeats):
            for t in thresholds if round_ % 2 == 0 else reversed(thresholds):
                runs[t].append(draw(decoder, float(t), args.size, args.steps, args.seed))
            print(f"[step-cache-bench] round {round_ + 1}: "
                  + ", ".join(f"{t}: {runs[t][-1]['denoise_s']:.2f} s" for t in thresholds), flush=True)  # fmt: skip
        decoder.close()
    load["end"] = os.getloadavg()[0]
    results = {t: summarize(r) for t, r in runs.items()}
    print()
    print(table(results))
    print(f"\nload average (1 min): start {load['start']:.2f}, end {load['end']:.2f}")
    if args.out is not None:
        report = {
            "created": datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "torch": torch.__version__},
            "loadavg": load,
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
