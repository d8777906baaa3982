"""One decode step on a GPU: wall time against GPU-busy time, kernel count, the attention kernel.

Runs the LLM runner in-process (no server) on --model, prefills --seqs sequences of --context
random tokens, then profiles --steps decode steps with torch.profiler: the GPU-busy time is the
sum of the CUDA kernels' and copies' durations, the wall time is the host's; busy/wall well
below 50 % means the step is launch- or sync-bound (review C2-C4). A second batch repeats it
with every sampler feature on (seeded rows, penalties, logit bias, a grammar mask per row),
to show what sampling adds. Prints one JSON object (and writes it to --json).

    python bench/gpu_step_probe.py --model /tmp/q100m --dtype bfloat16 --json /tmp/probe.json

Exits 2 with a message when CUDA is not available.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np
import torch

from gpu_workers.llm.runner import LLMRunner
from omni.shared import protocol


def options(featured: bool, i: int) -> protocol.SamplingOptions:
    if not featured:
        return protocol.SamplingOptions(temperature=0.0)
    return protocol.SamplingOptions(
        temperature=0.8, top_p=0.95, top_k=50, seed=i, repetition_penalty=1.1, presence_penalty=0.3,
        frequency_penalty=0.2, logit_bias_token_ids=[5, 7], logit_bias_values=[1.0, -1.0],
    )  # fmt: skip


def full_mask(vocab: int) -> bytes:
    words = np.full((vocab + 31) // 32, -1, dtype="<i4")  # every token allowed: same work as a real mask
    return words.tobytes()


def busy_us(prof: torch.profiler.profile) -> tuple[float, int]:
    """Device time over kernels and copies (the profile table's "Self CUDA time total"), and
    how many there were."""
    total = sum(getattr(a, "self_device_time_total", 0.0) for a in prof.key_averages())
    count = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return float(total), count


def run_batch(runner: LLMRunner, args: argparse.Namespace, featured: bool, base: int) -> dict[str, Any]:
    rng = random.Random(base)
    vocab = runner.model_config.vocab_size
    bs = runner.block_size
    per_seq = -(-(args.context + args.steps + args.warmup + 2) // bs)
    ids = [f"{'f' if featured else 'g'}{i}" for i in range(args.seqs)]
    tables = {r: list(range(i * per_seq, (i + 1) * per_seq)) for i, r in enumerate(ids)}
    news = [
        protocol.NewRequest(r, [rng.randrange(vocab) for _ in range(args.context)], options(featured, i), tables[r], 0, args.context)
        for i, r in enumerate(ids)
    ]  # fmt: skip
    runner.execute(protocol.Step(base, news, [], []))
    computed = dict.fromkeys(ids, args.context)
    masks = [protocol.TokenMask(r, full_mask(vocab)) for r in ids] if featured else []

    def step(n: int) -> None:
        cached = [protocol.CachedRequest(r, [], computed[r], 1) for r in ids]
        runner.execute(protocol.Step(base + 1 + n, [], cached, [], token_masks=masks))
        for r in ids:
            computed[r] += 1

    for n in range(args.warmup):
        step(n)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        for n in range(args.steps):
            step(args.warmup + n)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    busy, kernels = busy_us(prof)
    runner.execute(protocol.Step(base + 10_000, [], [], ids))  # drop them
    return {
        "wall_ms_per_step": 1e3 * wall / args.steps,
        "gpu_busy_ms_per_step": busy / 1e3 / args.steps,
        "busy_over_wall": (busy / 1e6) / wall if wall > 0 else None,
        "kernels_per_step": kernels / args.steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu_step_probe: CUDA is not available (torch {torch.__version__}); nothing to probe", file=sys.stderr)
        sys.exit(2)
    blocks = 2 * args.seqs * -(-(args.context + args.steps + args.warmup + 2) // args.block_size)
    runner = LLMRunner(
        args.model, device=args.device, dtype=getattr(torch, args.dtype), block_size=args.block_size,
        num_kv_blocks=blocks, attention_backend=args.attention_backend,
    )  # fmt: skip
    mc = runner.model_config
    runner.attention_backend.warm_up(runner.kv_caches[0], mc.num_heads, mc.attention_scale)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(runner.device),
        "attention_backend": type(runner.attention_backend).__name__,
        "dtype": args.dtype,
        "seqs": args.seqs,
        "context": args.context,
        "greedy": run_batch(runner, args, featured=False, base=0),
        "every_sampler_feature": run_batch(runner, args, featured=True, base=100_000),
        "peak_memory_gib": torch.cuda.max_memory_allocated(runner.device) / 1024**3,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
