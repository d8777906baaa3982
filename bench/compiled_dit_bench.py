#!/usr/bin/env python3
"""The compiled DiT (gpu_workers/vision_decoder/compiled_dit.py) against eager on this CPU.

Issue 36, acceptance 4: the ratio against eager, the outputs' agreement (fp32), and the start-up
cost cold (an empty inductor cache) and warm (the cache a first start left). A checkpoint of
seeded random weights at the reference width (bench/step_cache_bench.py's) cut to --depth blocks;
one image of --size pixels, --steps steps, the whole decoder (guidance, VAE, PNG) each time.

Each start is a fresh process (python -c), as a worker's is: it loads the decoder with
compile_dit and reports how long VisionDecoder.from_dir took (the load plus the compile and the
warm-up draws), with TORCHINDUCTOR_CACHE_DIR at a new folder (cold), then the same folder again
(warm); eager's load is the baseline. The step times come from one process that holds both.

    .venv/bin/python bench/compiled_dit_bench.py                 # about 6 min on 1 idle core
    .venv/bin/python bench/compiled_dit_bench.py --depth 1 --steps 2 --repeats 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere, without an install
    sys.path.insert(0, str(ROOT))

from bench.step_cache_bench import CODE_GRID, CODEBOOK, REFERENCE_DIT
from gpu_workers.models.flux_dit import SingleStreamBlock
from gpu_workers.tiny.checkpoints import make_tiny_vision_decoder
from gpu_workers.vision_decoder import compiled_dit
from gpu_workers.vision_decoder.decoder import VisionDecoder
from omni.shared import protocol

LOAD = """
import sys, time, torch
sys.path.insert(0, {root!r})
torch.set_num_threads({threads})
from gpu_workers.vision_decoder.decoder import VisionDecoder
t = time.perf_counter()
VisionDecoder.from_dir({path!r}, compile_dit={compiled})
print(time.perf_counter() - t)
"""


def start_seconds(path: Path, compiled: bool, threads: int, cache: Path) -> float:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    code = LOAD.format(root=str(ROOT), threads=threads, path=str(path), compiled=compiled)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def job(size: int, steps: int, seed: int) -> protocol.ImageJob:
    codes = torch.randint(0, CODEBOOK[0], (CODE_GRID * CODE_GRID,), generator=torch.Generator().manual_seed(seed))
    return protocol.ImageJob(1, codes.tolist(), size, size, steps, seed)


def set_compiled(decoder: VisionDecoder, on: bool) -> None:
    halves = compiled_dit.compiled_halves() if on else (SingleStreamBlock.before_attention, SingleStreamBlock.after_attention)
    for block in decoder.transformer.blocks:
        cast(SingleStreamBlock, block).halves = halves


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=4, help="blocks of the main DiT (the reference has 35)")
    ap.add_argument("--size", type=int, default=256, help="image side in pixels (patch 1: (size/8)^2 tokens)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    report: dict[str, object] = {"args": {k: str(v) for k, v in vars(args).items()}, "cpus": os.cpu_count(), "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        codebook = torch.randn(*CODEBOOK, generator=torch.Generator().manual_seed(0))
        path = make_tiny_vision_decoder(
            Path(tmp) / "vd", seed=0, codebook=codebook, guidance="none", code_grid=(CODE_GRID, CODE_GRID),
            dit={**REFERENCE_DIT, "num_layers": args.depth},
        )  # fmt: skip
        cache = Path(tmp) / "inductor"
        starts = {
            "eager": start_seconds(path, False, args.threads, cache),
            "compiled, cold cache": start_seconds(path, True, args.threads, cache),
            "compiled, warm cache": start_seconds(path, True, args.threads, cache),
        }
        print("[compiled-dit] start (load + compile + warm-up draws): "
              + ", ".join(f"{k} {v:.1f} s" for k, v in starts.items()), flush=True)  # fmt: skip
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
        decoder = VisionDecoder.from_dir(path, compile_dit=True)
        j = job(args.size, args.steps, 0)
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        images: dict[str, torch.Tensor] = {}
        for round_ in range(args.repeats + 1):
            for mode in ("eager", "compiled") if round_ % 2 == 0 else ("compiled", "eager"):
                set_compiled(decoder, mode == "compiled")
                generation = decoder.decode([j])
                if round_:  # round 0 warms both
                    times[mode].append(generation.step_seconds)
                assert generation.latents is not None
                images[mode] = generation.latents
        decoder.close()
    diff = float((images["eager"] - images["compiled"]).abs().max())
    eager, comp = min(times["eager"]), min(times["compiled"])
    report.update(starts=starts, step_s=times, latent_max_abs_diff=diff, ratio=eager / comp)
    print(f"\n| | step s (min of {args.repeats}) | vs eager |\n|---|---|---|")
    print(f"| eager | {eager:.3f} | 1.00x |\n| compiled | {comp:.3f} | {eager / comp:.2f}x |")
    print(f"\nlatents' largest difference (fp32, {args.steps} steps): {diff:.2e}")
    print("start: " + ", ".join(f"{k} {v:.1f} s" for k, v in starts.items()))
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
