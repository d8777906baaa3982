#!/usr/bin/env python3
"""Image decoder replicas on CPU: 8 concurrent images through 1 replica against R.

Issue 36, acceptance 2: with 2 replicas of 1 thread each against 1 replica of 1 thread, 8
concurrent images complete at least 1.7x faster. The server's own placement runs
(omni/engines/vision_replicas.py: VisionDecoderReplicas over VisionDecoderEngines, each a real
worker process), without HTTP in front: the same draw() the images API calls. The decoder is
a checkpoint of seeded random weights at the reference width (bench/step_cache_bench.py's)
cut to --depth blocks, drawing --images images of --size pixels in --steps steps, each with its
own seed, all at once.

Reported per replica count: the wall time from the first draw to the last image (the minimum
over --repeats rounds, the counts alternating within a round so background load hits them
alike, the median beside it), images per minute, and which replica drew how many. Each seed's
image is compared across the layouts: it must be byte-equal wherever it was drawn, when its
batch was the same (bench prints the share equal; a batch of another size may move a pixel by
one step of rounding, as on one decoder).

    .venv/bin/python bench/image_replicas.py                      # about 5 min on 2 idle cores
    .venv/bin/python bench/image_replicas.py --depth 1 --steps 2 --repeats 1   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
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

from bench.step_cache_bench import CODE_GRID, CODEBOOK, REFERENCE_DIT
from gpu_workers.tiny.checkpoints import make_tiny_vision_decoder
from omni.config import VisionDecoderConfig
from omni.engines.vision_decoder import ImageRequest
from omni.engines.vision_replicas import VisionDecoderReplicas
from omni.metrics import Metrics
from omni.shared import protocol


def checkpoint(root: Path, depth: int, guidance: str, seed: int) -> Path:
    codebook = torch.randn(*CODEBOOK, generator=torch.Generator().manual_seed(seed))
    return make_tiny_vision_decoder(
        root, seed=seed, codebook=codebook, guidance=guidance, code_grid=(CODE_GRID, CODE_GRID),
        dit={**REFERENCE_DIT, "num_layers": depth},
    )  # fmt: skip


async def start(path: Path, replicas: int, threads: int, max_batch: int) -> VisionDecoderReplicas:
    specs = [
        protocol.VisionDecoderWorkerSpec(worker_id=r, model_dir=str(path), num_threads=threads)
        for r in range(replicas)
    ]
    config = VisionDecoderConfig(replicas=replicas, max_batch_images=max_batch, max_queued_images=64)
    group = VisionDecoderReplicas(specs, Metrics(), "bench", config, start_timeout=600)
    await asyncio.gather(*(w.start() for w in group.workers))
    return group


async def burst(group: VisionDecoderReplicas, n: int, size: int, steps: int, seed: int) -> tuple[float, list[bytes], list[int]]:
    codes = tuple(torch.randint(0, CODEBOOK[0], (CODE_GRID * CODE_GRID,), generator=torch.Generator().manual_seed(seed)).tolist())
    before = [e.metrics.replica_jobs.labels("bench", str(e.replica), "ok")._value.get() for e in group.replicas]
    t = time.perf_counter()
    images = await asyncio.gather(
        *(group.draw(ImageRequest(codes=codes, width=size, height=size, steps=steps, seed=seed + i)) for i in range(n))
    )
    wall = time.perf_counter() - t
    after = [e.metrics.replica_jobs.labels("bench", str(e.replica), "ok")._value.get() for e in group.replicas]
    return wall, [i.data for i in images], [int(a - b) for a, b in zip(after, before)]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(c) for c in args.replicas.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint(Path(tmp) / "decoder", args.depth, args.guidance, args.seed)
        groups = {c: await start(path, c, args.threads, args.max_batch_images) for c in counts}
        try:
            for c in counts:  # warm-up: each worker's first shapes
                await burst(groups[c], args.images, args.size, args.steps, args.seed)
            walls: dict[int, list[float]] = {c: [] for c in counts}
            shares: dict[int, list[int]] = {}
            data: dict[int, list[bytes]] = {}
            for round_ in range(args.repeats):
                for c in counts if round_ % 2 == 0 else reversed(counts):
                    wall, data[c], shares[c] = await burst(groups[c], args.images, args.size, args.steps, args.seed)
                    walls[c].append(wall)
                print(f"[image-replicas] round {round_ + 1}: " + ", ".join(f"{c}: {walls[c][-1]:.2f} s" for c in counts), flush=True)
        finally:
            for group in groups.values():
                await asyncio.gather(*(w.stop() for w in group.workers))
    base = counts[0]
    return {
        str(c): {
            "wall_s_min": min(walls[c]),
            "wall_s_median": statistics.median(walls[c]),
            "images_per_min": 60 * args.images / min(walls[c]),
            "speedup_vs_first": min(walls[base]) / min(walls[c]),
            "images_by_replica": shares[c],
            "bytes_equal_to_first": sum(a == b for a, b in zip(data[c], data[base])) / args.images,
            "walls": walls[c],
        }
        for c in counts
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", default="1,2", help="replica counts to compare, the first is the baseline")
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--depth", type=int, default=2, help="blocks of the main DiT (the reference has 35)")
    ap.add_argument("--size", type=int, default=128, help="image side in pixels (patch 1: (size/8)^2 tokens)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--guidance", choices=("none", "autoguidance", "cfg"), default="none")
    ap.add_argument("--max-batch-images", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each replica's process")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write a JSON report here")
    args = ap.parse_args(argv)
    load = {"start": os.getloadavg()[0]}
    results = asyncio.run(run(args))
    load["end"] = os.getloadavg()[0]
    print("\n| replicas | wall s (min) | median | images/min | speed-up | images by replica | same bytes as first |")
    print("|---|---|---|---|---|---|---|")
    for c, r in results.items():
        print(f"| {c} | {r['wall_s_min']:.2f} | {r['wall_s_median']:.2f} | {r['images_per_min']:.1f} "
              f"| {r['speedup_vs_first']:.2f}x | {r['images_by_replica']} | {r['bytes_equal_to_first']:.0%} |")  # fmt: skip
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
