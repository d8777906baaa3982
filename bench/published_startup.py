#!/usr/bin/env python3
"""Start-up on a published-layout checkpoint: bytes read, time to /health, each worker's memory.

    python bench/published_startup.py [--out bench/.cache/published-1g] [--port 8391]

Builds (once) a checkpoint in the published HyperCLOVAX-SEED-Omni-8B layout whose LLM part is
over 1 GB (gpu_workers/tiny/published.py with a wider, deeper LLM), evicts its files from the
page cache (posix_fadvise DONTNEED: no root needed), starts `bin/omni-serve DIR`, and once
/health answers 200 reads every process of the server's tree:
  - /proc/<pid>/io read_bytes: bytes that process made the kernel read from storage (cold
    cache, so each byte of the checkpoint is counted where it is first read);
  - VmRSS, against the bytes of that worker's own weights (the LLM's prefix, the encoders'
    prefixes, decoder/vision/, decoder/audio/).
Issue 20's acceptance: all read_bytes add up to at most 1.2x the checkpoint's size, and an
encoder or decoder worker's RSS stays under its own weights plus 500 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# An LLM of ~360M parameters: 1.45 GB in float32.
BIG_LLM = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "attention_multiplier": 1 / 128,
}


def build(out: Path) -> Path:
    from gpu_workers.tiny.published import make_tiny_published_checkpoint

    marker = out / ".bench_ckpt.json"
    if marker.is_file() and json.loads(marker.read_text()) == BIG_LLM:
        return out
    make_tiny_published_checkpoint(out, seed=0, llm_overrides=BIG_LLM)
    marker.write_text(json.dumps(BIG_LLM))
    return out


def evict(root: Path) -> int:
    total = 0
    for path in root.rglob("*"):
        if path.is_file():
            total += path.stat().st_size
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return total


def tree(pid: int) -> list[int]:
    out = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.is_file():
        for child in children.read_text().split():
            out += tree(int(child))
    return out


def proc_info(pid: int) -> dict[str, object]:
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    status = dict(line.split(":\t") for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    return {
        "pid": pid,
        "name": Path(f"/proc/{pid}/comm").read_text().strip(),
        "read_bytes": int(io["read_bytes"]),
        "rss_bytes": int(status["VmRSS"].split()[0]) * 1024,
    }


def own_weights(root: Path) -> dict[str, int]:
    """Bytes of each worker kind's own weights, from the safetensors headers and the folders."""
    from omni.shared.safetensors_index import PUBLISHED_PREFIXES, SafetensorsIndex

    index = SafetensorsIndex.read(root)
    prefix_bytes = index.nbytes
    encoders = sum(prefix_bytes(PUBLISHED_PREFIXES[c]) for c in PUBLISHED_PREFIXES if c != "llm")
    folder = lambda p: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())  # noqa: E731
    return {
        "llm": prefix_bytes(PUBLISHED_PREFIXES["llm"]),
        "encoder": encoders,
        "vision": folder(root / "decoder" / "vision") if (root / "decoder" / "vision").is_dir() else 0,
        "audio": folder(root / "decoder" / "audio") if (root / "decoder" / "audio").is_dir() else 0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "bench" / ".cache" / "published-1g")
    p.add_argument("--port", type=int, default=8391)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    root = build(args.out)
    size = evict(root)
    weights = own_weights(root)
    print(f"checkpoint {root}: {size / 1e6:.1f} MB; own weights (MB): "
          + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in weights.items()))
    start = time.monotonic()
    server = subprocess.Popen(
        [str(REPO / "bin" / "omni-serve"), str(root), "--port", str(args.port), "--max-model-len", "2048"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the server exited: {server.stderr.read() if server.stderr else ''}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() - start > args.timeout:
                raise SystemExit("no /health 200 in time")
            time.sleep(0.2)
        ready = time.monotonic() - start
        procs = [proc_info(pid) for pid in tree(server.pid)]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    total_read = sum(int(p["read_bytes"]) for p in procs)  # type: ignore[call-overload]
    print(f"/health 200 after {ready:.1f} s")
    for info in procs:
        print(f"  {info['name']:<16} pid {info['pid']:<7} read {int(info['read_bytes']) / 1e6:9.1f} MB"  # type: ignore[call-overload]
              f"   rss {int(info['rss_bytes']) / 1e6:8.1f} MB")  # type: ignore[call-overload]
    print(f"all processes read {total_read / 1e6:.1f} MB = {total_read / size:.2f}x the checkpoint ({size / 1e6:.1f} MB)")
    kinds = {"omni-encoder": "encoder", "omni-vision": "vision", "omni-audio": "audio", "omni-llm": "llm"}
    for info in procs:
        kind = next((k for prefix, k in kinds.items() if str(info["name"]).startswith(prefix)), None)
        if kind is None or kind == "llm":
            continue
        slack = (int(info["rss_bytes"]) - weights[kind]) / 1e6  # type: ignore[call-overload]
        print(f"  {info['name']}: rss - own weights = {slack:.1f} MB (bound 500)")


if __name__ == "__main__":
    main()
