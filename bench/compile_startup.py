#!/usr/bin/env python3
"""Start-up with the compiled decode step: time to /health 200, eager, cold and with a warm cache.

    python bench/compile_startup.py --model bench/.cache/qwen2-100m [--dtype bfloat16] [--threads 2]

Starts `bin/omni-serve MODEL` three times, one after another, and times each from the launch
to the first /health 200:
  - eager: --enforce-eager (the baseline);
  - cold: --compile-decode with an empty inductor cache (a fresh TORCHINDUCTOR_CACHE_DIR);
  - warm: --compile-decode again with the cache the cold start left.
It also prints the LLM worker's own log lines that say where the compile time went (per
bucket, and the total). Run it on a quiet machine: every number here is CPU-bound.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def time_to_health(cmd: list[str], port: int, env: dict[str, str], timeout: float) -> tuple[float, list[str]]:
    start = time.monotonic()
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []

    def read() -> None:
        assert server.stderr is not None
        for line in server.stderr:
            lines.append(line.rstrip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit("the server exited:\n" + "\n".join(lines[-30:]))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - start, [x for x in lines if "compiled decode step" in x]
            except OSError:
                pass
            if time.monotonic() - start > timeout:
                raise SystemExit("no /health 200 in time:\n" + "\n".join(lines[-30:]))
            time.sleep(0.2)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--port", type=int, default=8397)
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    base = [str(REPO / "bin" / "omni-serve"), args.model, "--port", str(args.port), "--dtype", args.dtype,
            "--max-num-seqs", str(args.max_num_seqs)]  # fmt: skip
    if args.threads:
        base += ["--num-threads", str(args.threads)]
    with tempfile.TemporaryDirectory(prefix="omni-inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        for label, extra in (("eager", ["--enforce-eager"]), ("cold", ["--compile-decode"]),
                             ("warm", ["--compile-decode"])):  # fmt: skip
            seconds, log = time_to_health(base + extra, args.port, env, args.timeout)
            print(f"{label:<6} /health 200 after {seconds:6.1f} s", flush=True)
            for line in log:
                print(f"         {line[-120:]}")


if __name__ == "__main__":
    sys.exit(main())
