"""Decode attention alone, one layer: the paged CPU kernel (attention/cpu_paged.py) against the
compiled step's inductor "gather" kernel (attention/compiled_decode.py), interleaved call by call.

The shape is issue 23's acceptance one, the 100M qwen2 benchmark checkpoint's: 32 sequences at
200-215 tokens of context, 4 KV heads of 3 query heads each, head dim 64, blocks of 16 scattered
over the cache. Each variant gets the same q, own k/v and cache; medians and best of --calls
calls per round, and the K+V bytes read per call over the median time. Each call reads the next
of --layers caches in turn, as a step's layers do, so that they are not all in the CPU's cache.

    python bench/paged_attention_bench.py --dtype bfloat16 --threads 1
    python bench/paged_attention_bench.py --dtype float32 --threads 2 --rounds 5

Variants: `gather` and `paged` (the compiled step's kernels, compiled as the step compiles
them), `eager` (the kernel called directly, as eager decode calls it), and `eager@REV` (the
kernel's source as of git revision REV, built and loaded beside today's: a change to the kernel
measured against its predecessor in one run). The caches are allocated as the server's are
(gpu_workers/llm/memory.py: huge pages where the host gives them).

    python bench/paged_attention_bench.py --dtype float32 --threads 2 --variants eager@6609b90,eager

--chunks times continuing prefill chunks instead: a chunk of N tokens after C cached ones
(N:C, comma-separated), read in place by the kernel (cpu_paged.attend_chunks) against what the
SDPA backend does without it, its own blocks copied out and one SDPA call under the folded causal
mask (torch_sdpa._continuing; the mask built once per step, so outside the timing).

    python bench/paged_attention_bench.py --dtype float32 --threads 2 --chunks 256:256,20:200,64:960,512:1536
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch

from gpu_workers.attention import cpu_paged
from gpu_workers.attention.compiled_decode import DECODE_KERNELS
from gpu_workers.llm.memory import kv_cache_zeros


def kernel_at(rev: str) -> types.ModuleType:
    """attention/cpu_paged.py (and its cpu_paged.c, where that revision has one) as of git
    revision rev, loaded beside today's (its ops renamed)."""
    folder = Path(tempfile.mkdtemp(prefix=f"cpu_paged_at_{rev}_"))
    for name in ("cpu_paged.py", "cpu_paged.c"):
        shown = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:gpu_workers/attention/{name}"],
                               capture_output=True, text=True)  # fmt: skip
        if shown.returncode == 0:
            (folder / name).write_text(shown.stdout)
    module = types.ModuleType(f"cpu_paged_at_{rev}")
    module.__file__ = str(folder / "cpu_paged.py")
    src = (folder / "cpu_paged.py").read_text().replace('"omni::', '"omni_at_rev::')
    exec(compile(src, f"cpu_paged.py@{rev}", "exec"), module.__dict__)
    return module


def cache(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A random cache allocated as the server allocates its own."""
    out = kv_cache_zeros(shape, dtype, torch.device("cpu"))
    out.copy_(torch.randn(shape))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--context", type=int, default=200, help="the shortest row's context; rows go up to +15")
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--group", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=12, help="caches read in turn (the model's layers)")
    ap.add_argument("--variants", default="gather,paged")
    ap.add_argument("--chunks", default="", help="N:C,... continuing chunks of N tokens after C cached ones")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if args.chunks:
        return chunks(args, dtype)
    b, h, g, d, bs = args.seqs, args.kv_heads, args.group, args.head_dim, args.block_size
    rng = random.Random(0)
    lens = [args.context + rng.randrange(16) for _ in range(b)]
    per = -(-(max(lens) + 1) // bs)
    blocks = list(range(b * per + 1))
    rng.shuffle(blocks)
    table = torch.tensor([blocks[i * per : (i + 1) * per] for i in range(b)])
    caches = [(cache((len(blocks), bs, h, d), dtype), cache((len(blocks), bs, h, d), dtype)) for _ in range(args.layers)]
    q = torch.randn(b, h, g, d).to(dtype)  # the model's dtype, as the compiled step passes it
    k_new = torch.randn(b, h, d).to(dtype)
    v_new = torch.randn(b, h, d).to(dtype)
    cached = torch.tensor(lens) - 1
    scale = d**-0.5
    if not cpu_paged.available():
        raise SystemExit("the paged kernel is unavailable here (see the log line above)")
    calls: dict[str, Callable[[int], torch.Tensor]] = {}
    for name in args.variants.split(","):
        if name.startswith("eager"):
            rev = name.partition("@")[2]
            module = kernel_at(rev) if rev else cpu_paged
            if not module.available():
                raise SystemExit(f"{name}: the kernel did not build")
            fn = module.attend
        else:
            fn = torch.compile(DECODE_KERNELS[name], fullgraph=True, dynamic=True)  # as the step compiles it
        calls[name] = lambda i, fn=fn: fn(q, *caches[i % len(caches)], table, cached, k_new, v_new, scale)
    with torch.inference_mode():
        outs = {name: call(0) for name, call in calls.items()}
        first = next(iter(calls))
        for name, out in outs.items():
            print(f"{name}: worst difference to {first} {(out - outs[first]).abs().max().item():.2e}")
        times: dict[str, list[float]] = {n: [] for n in calls}
        offset = len(caches) // len(calls)  # each variant a layer the previous one did not just read
        for i in range(args.rounds * args.calls):
            for j, (name, call) in enumerate(calls.items()):
                t = time.perf_counter()
                call(i + j * offset)
                times[name].append(time.perf_counter() - t)
    nbytes = 2 * sum(lens) * h * d * caches[0][0].element_size()
    med = {n: sorted(v)[len(v) // 2] for n, v in times.items()}
    print(f"\n{args.dtype}, {b} rows at {min(lens)}-{max(lens)} tokens, Hkv {h} x G {g}, D {d}, blocks of {bs}, "
          f"{args.threads} threads, {len(times[first])} calls each, interleaved; K+V {nbytes / 1e6:.1f} MB a call")  # fmt: skip
    for n, m in med.items():
        print(f"  {n:<8} median {m * 1e3:7.3f} ms  best {min(times[n]) * 1e3:7.3f} ms  x{m / med[first]:.2f} of {first}"
              f"  {nbytes / m / 1e9:5.1f} GB/s")  # fmt: skip


def chunks(args: argparse.Namespace, dtype: torch.dtype) -> None:
    from gpu_workers.attention.torch_sdpa import PrefillChunk, _continuing

    h, g, d, bs = args.kv_heads, args.group, args.head_dim, args.block_size
    rng = random.Random(0)
    print(f"{args.dtype}, Hkv {h} x G {g}, D {d}, blocks of {bs}, {args.threads} threads, "
          f"{args.rounds * args.calls} calls each, interleaved")  # fmt: skip
    for spec in args.chunks.split(","):
        n, cached = (int(x) for x in spec.split(":"))
        ctx = n + cached
        num_blocks = 4 * -(-ctx // bs)
        caches = []
        for _ in range(args.layers):
            caches.append([cache((num_blocks, bs, h, d), dtype) for _ in range(2)])
        ids = rng.sample(range(num_blocks), -(-ctx // bs))
        table, block_ids = torch.tensor([ids]), torch.tensor(ids)
        q = torch.randn(n, h * g, d).to(dtype)
        scale = d**-0.5
        chunk = PrefillChunk(0, n, ctx, block_ids, None)

        def kernel(i: int) -> torch.Tensor:
            kc, vc = caches[i % len(caches)]
            out = cpu_paged.attend_chunks(q.view(n, h, g, d), kc, vc, table, torch.tensor([0]), torch.tensor([n]),
                                          torch.tensor([ctx]), scale)  # fmt: skip
            return out.to(dtype).view(n, h * g, d)

        def copied(i: int) -> torch.Tensor:
            kc, vc = caches[i % len(caches)]
            kp = kc.index_select(0, block_ids).view(-1, h, d)[:ctx].transpose(0, 1)[None]
            vp = vc.index_select(0, block_ids).view(-1, h, d)[:ctx].transpose(0, 1)[None]
            return _continuing(q, kp, vp, chunk, scale)

        calls = {"in place": kernel, "copied": copied}
        with torch.inference_mode():
            diff = (kernel(0).float() - copied(0).float()).abs().max().item()
            times: dict[str, list[float]] = {name: [] for name in calls}
            for i in range(args.rounds * args.calls):
                for j, (name, call) in enumerate(calls.items()):
                    t = time.perf_counter()
                    call(i + j * (len(caches) // 2))
                    times[name].append(time.perf_counter() - t)
        med = {name: sorted(v)[len(v) // 2] for name, v in times.items()}
        print(f"  chunk {n:4d} after {cached:5d}: in place {med['in place'] * 1e3:7.3f} ms, copied + SDPA "
              f"{med['copied'] * 1e3:7.3f} ms, x{med['copied'] / med['in place']:.2f} faster in place; "
              f"worst difference {diff:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
