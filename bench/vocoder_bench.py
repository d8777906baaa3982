#!/usr/bin/env python3
"""The unit vocoder's real-time factor per chunk (issue 11, acceptance point 3).

RTF = seconds of compute / seconds of audio the chunk gives (units / 25 s). Below 1 a stream
keeps up. Measured for what the output router sends a stream: a first chunk of --first units
(default 2, 4 and 8) from a fresh state, then steady chunks of --steady units (default 25, one
second) carrying the state, at two widths with seeded random weights built in memory:

  tiny       the embedded default checkpoint's config (gpu_workers/tiny/checkpoints.py
             TINY_VOCODER: 64 channels, five stages, two AMP kernels)
  reference  UnitVocoderConfig()'s defaults: BigVGAN-v2 24 kHz widths (1536 channels, AMP
             kernels 3, 7, 11, dilations 1, 3, 5) in six stages for hop 960 (5, 4, 4, 3, 2, 2)

each with 1 thread and with every core (--threads). Timing: torch.inference_mode; each chunk
shape runs once unmeasured first; then --repeats streams per first-chunk size, each a first
chunk and --steady-chunks steady ones; the median (and min) per chunk size is reported. On a
shared machine the figures are only indicative: the 1-minute load average before and after is
printed.

    .venv/bin/python bench/vocoder_bench.py                               # both widths: minutes on 2 cores
    .venv/bin/python bench/vocoder_bench.py --widths tiny --repeats 7     # seconds
    .venv/bin/python bench/vocoder_bench.py --device cuda --dtype bfloat16 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_workers.models.unit_vocoder import UnitVocoder, UnitVocoderConfig, random_unit_vocoder  # noqa: E402
from gpu_workers.tiny.checkpoints import TINY_VOCODER, TINY_VOICES  # noqa: E402

WIDTHS = {
    "tiny": UnitVocoderConfig.from_dict({**TINY_VOCODER, "num_units": 81, "num_speakers": len(TINY_VOICES)}),
    "reference": UnitVocoderConfig(num_speakers=4),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_stream(model: UnitVocoder, sizes: list[int], seed: int) -> list[float]:
    """Decode one stream in chunks of `sizes` units; seconds per chunk."""
    c = model.config
    device = model.conv_pre.weight.device
    gen = torch.Generator().manual_seed(seed)
    units = torch.randint(0, c.num_units, (1, sum(sizes)), generator=gen).to(device)
    speaker = model.speaker_embedding(torch.tensor([seed % c.num_speakers], device=device))
    state = model.init_state(1)
    seconds = []
    start = 0
    for size in sizes:
        _sync(device)
        t0 = time.perf_counter()
        _, state = model.decode_chunk(units[:, start : start + size], speaker, state)
        _sync(device)
        seconds.append(time.perf_counter() - t0)
        start += size
    return seconds


def run(width: str, threads: int, args: argparse.Namespace) -> list[dict[str, object]]:
    torch.set_num_threads(threads)
    config = WIDTHS[width]
    model = random_unit_vocoder(config, seed=0, device=args.device, dtype=DTYPES[args.dtype])
    with torch.inference_mode():
        timed_stream(model, [*args.first, args.steady], seed=99)  # warm-up: every chunk shape once
        times: dict[tuple[str, int], list[float]] = {}
        for first in args.first:
            for r in range(args.repeats):
                seconds = timed_stream(model, [first] + [args.steady] * args.steady_chunks, seed=r)
                times.setdefault(("first", first), []).append(seconds[0])
                times.setdefault(("steady", args.steady), []).extend(seconds[1:])
    rows = []
    for (kind, units), seconds in times.items():
        audio = units / config.units_per_second
        median = statistics.median(seconds)
        rows.append({
            "width": width, "threads": threads, "chunk": kind, "units": units, "audio_ms": audio * 1000,
            "median_ms": median * 1000, "min_ms": min(seconds) * 1000, "rtf": median / audio, "n": len(seconds),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", default="tiny,reference", help="comma-separated: tiny, reference")
    p.add_argument("--threads", default=f"1,{os.cpu_count()}", help="comma-separated thread counts")
    p.add_argument("--first", type=int, nargs="+", default=[2, 4, 8], help="first-chunk sizes (units)")
    p.add_argument("--steady", type=int, default=25, help="steady chunk size (units)")
    p.add_argument("--steady-chunks", type=int, default=2, help="steady chunks per stream")
    p.add_argument("--repeats", type=int, default=5, help="streams per first-chunk size")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    widths = [w for w in args.widths.split(",") if w]
    unknown = sorted(set(widths) - set(WIDTHS))
    if unknown:
        p.error(f"unknown widths {unknown}; choose from {', '.join(WIDTHS)}")
    thread_counts = sorted({int(t) for t in args.threads.split(",") if t})

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, device {args.device}, {args.dtype}")
    for width in widths:
        c = WIDTHS[width]
        with torch.device("meta"):
            params = sum(p.numel() for p in UnitVocoder(c).parameters())
        print(f"  {width}: {params / 1e6:.2f} M parameters, upsample {list(c.upsample_rates)}, "
              f"{c.upsample_initial_channel} channels, AMP kernels {list(c.resblock_kernel_sizes)}")  # fmt: skip
    load_before = os.getloadavg()[0]
    rows: list[dict[str, object]] = []
    for width in widths:
        for threads in thread_counts:
            rows += run(width, threads, args)
    load_after = os.getloadavg()[0]

    header = f"{'width':<10} {'threads':>7} {'chunk':<7} {'units':>5} {'audio ms':>9} "
    header += f"{'median ms':>10} {'min ms':>9} {'RTF':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['width']:<10} {r['threads']:>7} {r['chunk']:<7} {r['units']:>5} {r['audio_ms']:>9.0f} "
              f"{r['median_ms']:>10.1f} {r['min_ms']:>9.1f} {r['rtf']:>7.3f}")  # fmt: skip
    print(f"1-minute load average: {load_before:.2f} before, {load_after:.2f} after")
    if args.out is not None:
        args.out.write_text(json.dumps({"rows": rows, "load_before_after": [load_before, load_after]}, indent=2))


if __name__ == "__main__":
    main()
