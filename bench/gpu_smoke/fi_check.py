"""FlashInfer through our own backend (gpu_workers/attention), on the lent GPU, before any
server depends on it: create_attention_backend("flashinfer", ...), its warm-up, metadata and
forward over a paged bf16 cache, against paged_varlen_reference in float32.

--rows short: chunks of at most 64 query rows (decodes, a prompt, a later chunk, a prefix hit);
  on sm90 FlashInfer's "auto" plans FA2 for these. The backend's warm_up runs first (what a
  worker runs before it reports ready).
--rows long: a 2048-row prompt and a 200-row chunk after 300 cached (FA3 on sm90: what the
  LLM worker's profile run, an 8192-token prefill, plans).
The first forward's time includes the JIT build when FlashInfer's cache is cold. Writes one
JSON object to --json; exit 0 when every output is within tolerance.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

SHORT = [(11, 1), (0, 9), (32, 5), (15, 1), (3, 33), (40, 1), (0, 64)]  # (cached tokens, new rows)
LONG = [(0, 2048), (300, 200), (57, 1)]
TOLERANCE = 2e-2  # bf16 inputs and output against a float32 reference: absolute + relative


def sync(dev: Any) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()


def kernel_name(backend: Any) -> str | None:
    """Which FlashInfer kernel family the last plan chose (fa2/fa3), where the backend says."""
    for owner, attr in ((backend, "kernel"), (getattr(backend, "_wrapper", None), "_backend")):
        value = getattr(owner, attr, None)
        if isinstance(value, str):
            return value
    return None


def check(rows: str, heads_arg: str, out: dict[str, Any], backend_name: str = "flashinfer", device: str = "cuda:0") -> bool:
    import torch

    out["torch"] = torch.__version__
    if backend_name == "flashinfer":
        t = time.perf_counter()
        import flashinfer

        out["import_s"] = round(time.perf_counter() - t, 1)
        out["flashinfer"] = flashinfer.__version__
    from gpu_workers.attention.backend import HeadShape, SequenceChunk
    from gpu_workers.attention.paged_varlen import build_paged_varlen, paged_varlen_reference
    from gpu_workers.attention.registry import auto_backend_name, create_attention_backend

    hq, hkv, d = (int(x) for x in heads_arg.split(","))
    heads, bs, dev, dt = HeadShape(hq, hkv, d), 16, torch.device(device), torch.bfloat16
    out["auto_picks"] = auto_backend_name(bs, dev, dt, heads)
    rng = random.Random(0)
    free = list(range(1024))
    rng.shuffle(free)
    chunks, start = [], 0
    for cached, n in SHORT if rows == "short" else LONG:
        blocks = [free.pop() for _ in range(-(-(cached + n) // bs))]
        chunks.append(SequenceChunk(start, n, cached, blocks))
        start += n
    g = torch.Generator(device=dev).manual_seed(0)
    kc, vc = (torch.randn(1024, bs, hkv, d, generator=g, device=dev).to(dt) for _ in range(2))
    q = torch.randn(start, hq, d, generator=g, device=dev).to(dt)
    k, v = (torch.randn(start, hkv, d, generator=g, device=dev).to(dt) for _ in range(2))
    scale = d**-0.5
    backend = create_attention_backend(backend_name, block_size=bs, device=dev, dtype=dt, heads=heads)
    out["backend"] = type(backend).__name__
    backend.check_cache((kc, vc), heads)
    if rows == "short":
        t = time.perf_counter()
        backend.warm_up((kc, vc), hq, scale)
        sync(dev)
        out["warm_up_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    got = backend.forward(q, k, v, (kc, vc), backend.build_metadata(chunks), scale)
    sync(dev)
    out["first_forward_s"] = round(time.perf_counter() - t, 1)
    out["kernel"] = kernel_name(backend)
    t = time.perf_counter()
    for _ in range(10):
        backend.forward(q, k, v, (kc, vc), backend.build_metadata(chunks), scale)
    sync(dev)
    out["forward_ms"] = round(100 * (time.perf_counter() - t), 3)  # metadata + plan + run, per call
    # the reference reads the cache the forward wrote this step's K/V into
    ref = paged_varlen_reference(q.float().cpu(), kc.float().cpu(), vc.float().cpu(),
                                 build_paged_varlen(chunks, bs, torch.device("cpu")), scale)  # fmt: skip
    err = (got.float().cpu() - ref).abs()
    out["max_abs_err"] = float(err.max())
    return bool((err <= TOLERANCE * (1 + ref.abs())).all()) and got.shape == q.shape and got.dtype == dt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", choices=("short", "long"), required=True)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--heads", default="12,4,64", help="query heads, KV heads, head dim (the 100M checkpoint's)")
    p.add_argument("--backend", default="flashinfer", help="another backend runs the same calls (a CPU test: torch_sdpa)")
    p.add_argument("--device", default="cuda:0")
    a = p.parse_args()
    out: dict[str, Any] = {"rows": a.rows, "ok": False}
    try:
        out["ok"] = check(a.rows, a.heads, out, a.backend, a.device)
    except Exception as exc:  # noqa: BLE001 - the JSON carries the failure
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        out["traceback"] = traceback.format_exc()[-4000:]
    a.json.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "traceback"}))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
