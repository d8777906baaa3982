"""Small-M linear layers on CPU: effective weight bandwidth (weight bytes / time) at M = 1-8 rows.

A decode step of one sequence (M = 1) or a speculative step's k+1 rows reads every weight once
and does little arithmetic, so its floor is the weight bytes over the machine's read bandwidth.
This measures, for a model's linear shapes, how close each kernel gets to that floor:

  linear        torch's F.linear (MKL / oneDNN as torch picks), the weight as stored
  packed32      oneDNN with the weight reordered once for 32 rows (models/packed_linear.py today)
  packed1       the same reordered for 1 row (batch_hint=1)
  woq8          torch._weight_int8pack_mm: int8 weight, per-channel scales, bf16 activations
  int4          torch._weight_int4pack_mm_for_cpu: 4-bit weight, groups of 32, bf16 activations
  compiled      torch.compile (inductor, freezing) of one nn.Linear (head and down shapes only,
                M = 1: each compile costs seconds)
  small         our kernels (gpu_workers/models/small_m_linear.cpp), when the extension builds:
                bf16 / fp32 weights, or int8 weights with per-channel scales (small-int8)

Each shape gets enough weight copies (>= 288 MB, clones of one packed weight) that a pass over
them reads what a real SmolLM2 bf16 step reads. Every timing is the best of --rounds, each round a pass over the copies, the kernels interleaved in a
fresh order each round, so a busy machine slows all of them alike.

    PYTHONPATH=. python bench/small_m_linear.py --threads 2 --rounds 7
    PYTHONPATH=. python bench/small_m_linear.py --dtypes bf16 int8 --rows 1 4
    PYTHONPATH=. python bench/small_m_linear.py --chain 30 --rounds 20   # SmolLM2's 30 layers + head
    PYTHONPATH=. python bench/small_m_linear.py --chain 30 --rounds 20 --dtypes int8   # all int8
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

# (name, in_features, out_features)
SHAPES = {
    "smollm2": [
        ("q|k|v", 576, 960),
        ("o", 576, 576),
        ("gate|up", 576, 3072),
        ("down", 1536, 576),
        ("head", 576, 49152),
    ],
    "qwen2-100m": [
        ("q|k|v", 768, 1280),
        ("o", 768, 768),
        ("gate|up", 768, 5888),
        ("down", 2944, 768),
        ("head", 768, 1472),
    ],
}
STREAM_BYTES = 288 << 20  # about SmolLM2 bf16's bytes a token; this CPU reports a 480 MB L3


def read_bandwidth(rounds: int) -> float:
    """GB/s of a 256 MB torch sum (float32)."""
    a = torch.ones(64 << 20)
    best = math.inf
    for _ in range(rounds):
        t = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t)
    return a.numel() * 4 / best / 1e9


def best_time(fn: Callable[[], object], rounds: int, warm: bool = True) -> float:
    if warm:
        fn()
    best = math.inf
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def candidates(
    dtype_name: str, k: int, n: int, copies: int, small: object | None
) -> dict[str, Callable[[torch.Tensor], object]]:
    """name -> a function of x (M, K) that runs the linear over every copy; built once per shape."""
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(n, k, generator=g) * k**-0.5
    ws = [w0]

    def clones(t: object) -> list:
        if isinstance(t, tuple):
            return [tuple(c.clone() for c in t) for _ in range(copies)]
        return [t.clone() for _ in range(copies)]  # type: ignore[attr-defined]

    out: dict[str, Callable[[torch.Tensor], object]] = {}
    if dtype_name in ("bf16", "fp32"):
        dt = torch.bfloat16 if dtype_name == "bf16" else torch.float32
        wd = clones(w0.to(dt))
        out["linear"] = lambda x: [F.linear(x, w) for w in wd]
        for hint in (32, 1):
            p = clones(torch.ops.mkldnn._reorder_linear_weight(wd[0], hint))
            out[f"packed{hint}"] = lambda x, p=p: [
                torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for w in p
            ]
        if small is not None:
            sw = clones(small.pack(wd[0]))  # type: ignore[attr-defined]
            out["small"] = lambda x, sw=sw: [small.linear(x, w, n) for w in sw]  # type: ignore[attr-defined]
    else:  # int8 / int4: bf16 activations
        from gpu_workers.models.int8_linear import quantize_per_channel

        q8 = clones(quantize_per_channel(w0, torch.bfloat16))
        q8b = [(q, s.to(torch.bfloat16)) for q, s in q8]
        if dtype_name == "int8":
            out["woq8"] = lambda x: [torch._weight_int8pack_mm(x, q, s) for q, s in q8b]
            if small is not None:
                sw8 = clones((small.pack(q8[0][0]), q8[0][1]))  # type: ignore[attr-defined]
                out["small"] = lambda x, sw8=sw8: [small.linear(x, w, n, s) for w, s in sw8]  # type: ignore[attr-defined]
        else:
            group = 32
            packed = []
            for w in ws:  # one, cloned below
                wg = w.view(n, k // group, group)
                lo, hi = wg.amin(-1), wg.amax(-1)
                scale = ((hi - lo) / 15).clamp_min(1e-8)
                q = ((wg - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).view(n, k)
                # qScaleAndZeros: (K/group, N, 2), zero = the value at q = 8 (torch's convention)
                sz = torch.stack([scale, lo + 8 * scale], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
                packed = clones((torch._convert_weight_to_int4pack_for_cpu(q, 1), sz))
            out["int4"] = lambda x: [torch._weight_int4pack_mm_for_cpu(x, b, group, sz) for b, sz in packed]
    return out


def weight_bytes(dtype_name: str, k: int, n: int) -> float:
    return {"bf16": 2, "fp32": 4, "int8": 1, "int4": 0.5}[dtype_name] * k * n


def compiled_gbps(k: int, n: int, dtype: torch.dtype, rounds: int) -> float:
    import torch._inductor.config as ic

    ic.freezing = True
    lin = torch.nn.Linear(k, n, bias=False).to(dtype).eval()
    f = torch.compile(lin)
    x = torch.randn(1, k, dtype=dtype)
    with torch.no_grad():
        f(x)
        t = best_time(lambda: f(x), rounds)
    return lin.weight.numel() * lin.weight.element_size() / t / 1e9


def chain(model: str, layers: int, rows: list[int], rounds: int, int8: bool = False) -> None:
    """A decode step's linear layers as served (PackedLinear, bf16): `layers` decoder layers of
    the model's shapes and the head, oneDNN alone against oneDNN + the small-M kernels,
    interleaved each round; ms a step and the GB/s of the weight bytes."""
    from torch import nn

    from gpu_workers.models.packed_linear import PackedLinear

    shapes = SHAPES[model]
    mlp = [(k, n) for name, k, n in shapes if name != "head"] * layers
    mlp += [(k, n) for name, k, n in shapes if name == "head"]
    nbytes = sum(2 * k * n for k, n in mlp)
    lins = [nn.Linear(k, n, bias=False).to(torch.bfloat16) for k, n in mlp]
    variants = {
        "onednn": [PackedLinear(lin, small_m=False) for lin in lins],
        "small-m": [PackedLinear(lin) for lin in lins],
    }
    if int8:  # every layer int8 (what --quantization int8 keeps in bf16 aside): the split GEMM vs ours
        from gpu_workers.models.int8_linear import Int8Linear

        split = [Int8Linear(lin) for lin in lins]
        for layer in split:
            layer.small = None
        variants = {"int8-split": split, "int8-small-m": [Int8Linear(lin) for lin in lins]}
        nbytes //= 2
    del lins
    print("| rows | " + " | ".join(f"{v} ms (GB/s)" for v in variants) + " |")
    print("|---|" + "---|" * len(variants))
    for m in rows:
        xs = {k: torch.randn(m, k, dtype=torch.bfloat16) for k in {k for k, _ in mlp}}
        best = dict.fromkeys(variants, math.inf)
        for _ in range(rounds):
            for v in random.sample(list(variants), len(variants)):
                t = time.perf_counter()
                for layer in variants[v]:
                    layer(xs[layer.in_features])
                best[v] = min(best[v], time.perf_counter() - t)
        cells = [f"{best[v] * 1e3:.1f} ({nbytes / best[v] / 1e9:.1f})" for v in variants]
        print(f"| {m} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(SHAPES), default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32", "int8", "int4"])
    ap.add_argument("--compiled", action="store_true", help="add torch.compile'd linears (slow to build)")
    ap.add_argument("--no-small", action="store_true", help="leave our extension out")
    ap.add_argument("--chain", type=int, default=0, help="time N decoder layers' linears + head as served")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.chain:
        with torch.inference_mode():
            chain(args.model, args.chain, args.rows, args.rounds, "int8" in args.dtypes and "bf16" not in args.dtypes)
        return
    small = None
    if not args.no_small:
        from gpu_workers.models import small_m_linear

        small = small_m_linear if small_m_linear.load() else None
        print(f"# our extension: {small_m_linear.isa()}")
    print(f"# torch {torch.__version__}, {args.threads} threads, {torch.backends.cpu.get_cpu_capability()}")
    print(f"# read bandwidth (256 MB sum): {read_bandwidth(args.rounds * 2):.1f} GB/s")
    print("| shape | K->N | dtype | kernel | " + " | ".join(f"M={m}" for m in args.rows) + " |")
    print("|---|---|---|---|" + "---|" * len(args.rows))
    with torch.inference_mode():
        for name, k, n in SHAPES[args.model]:
            for dt in args.dtypes:
                nbytes = weight_bytes(dt, k, n)
                copies = max(1, math.ceil(STREAM_BYTES / nbytes))
                act = torch.float32 if dt == "fp32" else torch.bfloat16
                fns = candidates(dt, k, n, copies, small)
                cells: dict[str, list[str]] = {kname: [] for kname in fns}
                for m in args.rows:
                    x = torch.randn(m, k).to(act)
                    best = dict.fromkeys(fns, math.inf)
                    for fn in fns.values():
                        fn(x)  # warm
                    for _ in range(args.rounds):  # interleaved, in a fresh order each round
                        for kname in random.sample(list(fns), len(fns)):
                            t = best_time(functools.partial(fns[kname], x), 1, warm=False) / copies
                            best[kname] = min(best[kname], t)
                    for kname, t in best.items():
                        cells[kname].append(f"{nbytes / t / 1e9:.1f}")
                for kname, row in cells.items():
                    print(f"| {name} | {k}->{n} | {dt} | {kname} | " + " | ".join(row) + " |", flush=True)
        if args.compiled:
            for name, k, n in SHAPES[args.model]:
                if name in ("head", "down"):
                    for dt, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
                        gbps = compiled_gbps(k, n, dtype, args.rounds * 3)
                        print(
                            f"| {name} | {k}->{n} | {dt} | compiled | {gbps:.1f} (M=1; cache-resident below the head) |"
                        )


if __name__ == "__main__":
    main()
