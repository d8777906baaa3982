#!/usr/bin/env python3
"""Text-serving benchmark: omni-serve vs ``transformers serve --continuous-batching`` vs a raw loop.

    .venv/bin/python bench/run_text_bench.py                       # the issue's benchmark (64 req, c=32, 128 tok)
    .venv/bin/python bench/run_text_bench.py --size tiny -n 4 -c 4 -m 8          # smoke test
    .venv/bin/python bench/run_text_bench.py --systems omni --omni-url http://127.0.0.1:8000/v1

Steps (each system runs alone, one after the other, on 127.0.0.1 only):

1. ``make_checkpoint.py`` -> ``bench/.cache/qwen2-<size>`` (reused when it already matches);
2. ``transformers``: start ``transformers serve --continuous-batching --device cpu --host
   127.0.0.1 --port P <ckpt>`` (the checkpoint is the forced model), wait for /health, run
   ``chat_load.py`` (a separate client process), stop the server;
3. ``omni``: the same with ``bin/omni-serve --model <ckpt> --port P`` when that file exists
   (or against ``--omni-url`` when given: nothing is started then);
4. ``raw``: ``raw_loop.py`` on the same checkpoint and prompts;
5. print a markdown table and write ``bench/results/text_<UTC date-time>.json``
   (server logs: ``bench/results/logs/``).

Every server is started in its own process group and killed (SIGTERM, then SIGKILL) at
the end, on error and on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

_children: list[subprocess.Popen] = []

TSERVE, OMNI, RAW = "transformers serve --continuous-batching", "omni-serve", "raw loop (torch, batched decode)"
NAMES = {"transformers": TSERVE, "omni": OMNI, "raw": RAW}


def log(msg: str) -> None:
    print(f"[run_text_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cmd: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log(f"starting: {' '.join(cmd)}  (log: {log_path.relative_to(REPO)})")
    f = open(log_path, "w")
    p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                         env={**os.environ, **(env or {})})
    p._logfile = f  # type: ignore[attr-defined]
    _children.append(p)
    return p


def stop_server(p: subprocess.Popen, grace: float = 15.0) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)
    else:
        # the leader is gone; make sure nothing of its group survives
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    getattr(p, "_logfile", None) and p._logfile.close()  # type: ignore[attr-defined]
    if p in _children:
        _children.remove(p)


def stop_all() -> None:
    for p in list(_children):
        stop_server(p, grace=5.0)


def _http(method: str, url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def wait_ready(base: str, p: subprocess.Popen | None, timeout: float, model_name: str | None = None) -> str:
    """Wait until the server really serves; return the model name to send.

    1. GET <root>/health until 200 (a server without /health, i.e. 404: GET <base>/models until 200);
       a 503 "starting" from /health keeps us waiting;
    2. POST a 1-token, temperature-0 chat completion until it answers 200 (retrying 503s), so lazy
       first-request initialisation (transformers' CB manager, omni's workers) is not measured.
    """
    root = base.rstrip("/").removesuffix("/v1")
    deadline = time.time() + timeout

    def alive():
        if p is not None and p.poll() is not None:
            raise RuntimeError(f"server exited with code {p.returncode} before becoming ready")
        if time.time() > deadline:
            raise TimeoutError(f"server at {base} not ready after {timeout}s")

    while True:
        alive()
        try:
            code, _ = _http("GET", root + "/health", timeout=5)
            if code == 404:
                code, _ = _http("GET", base.rstrip("/") + "/models", timeout=5)
            if code == 200:
                break
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(1.0)

    if model_name is None:
        try:
            code, text = _http("GET", base.rstrip("/") + "/models", timeout=10)
            model_name = json.loads(text)["data"][0]["id"] if code == 200 else None
        except Exception:  # noqa: BLE001
            model_name = None
    model_name = model_name or "default"
    probe = {"model": model_name, "messages": [{"role": "user", "content": "Ready?"}], "max_tokens": 1,
             "temperature": 0.0}
    while True:
        alive()
        try:
            code, text = _http("POST", base.rstrip("/") + "/chat/completions", probe, timeout=max(5.0, deadline - time.time()))
        except Exception as e:  # noqa: BLE001
            code, text = -1, str(e)
        if code == 200:
            return model_name
        if 400 <= code < 500 and code not in (404, 408, 429):
            raise RuntimeError(f"readiness probe rejected ({code}): {text[:300]}")
        time.sleep(1.0)


def run_client(base: str, label: str, args, out: Path, model: str, extra: list[str] | None = None) -> dict:
    """chat_load.py against base as a separate process; extra: more chat_load flags."""
    cmd = [sys.executable, str(BENCH / "chat_load.py"), "--base-url", base, "--label", label,
           "-n", str(args.num_requests), "-c", str(args.concurrency), "-m", str(args.max_tokens),
           "--seed", str(args.seed), "--prompt-words", str(args.prompt_words),
           "--warmup", str(args.warmup), "--timeout", str(args.client_timeout), "--out", str(out)]
    cmd += ["--model", model, *(extra or [])]
    log(f"client: {' '.join(cmd[1:])}")
    rc = subprocess.run(cmd, cwd=REPO, timeout=args.client_timeout + 600).returncode
    if not out.exists():
        raise RuntimeError(f"chat_load wrote no report (rc={rc})")
    rep = json.loads(out.read_text())
    rep["client_rc"] = rc
    return rep


def bench_server(label: str, cmd: list[str] | None, base: str, args, tmp: Path, logs: Path,
                 client_extra: list[str] | None = None) -> dict:
    p = None
    try:
        if cmd is not None:
            p = start_server(cmd, logs / f"{label}.log")
        t = time.time()
        model = wait_ready(base, p, args.ready_timeout, args.model_name)
        log(f"{label} ready after {time.time() - t:.1f}s (model {model!r})")
        return run_client(base, label, args, tmp / f"{label}.json", model, client_extra)
    finally:
        if p is not None:
            stop_server(p)
            log(f"{label} stopped")


def omni_cmd(ckpt: Path, port: int, extra: list[str]) -> list[str] | None:
    exe = REPO / "bin" / "omni-serve"
    if not exe.exists():
        return None
    cmd = [str(exe), "--model", str(ckpt), "--port", str(port)]
    try:  # bind loopback explicitly when the CLI knows --host
        h = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60, cwd=REPO)
        if "--host" in h.stdout + h.stderr:
            cmd += ["--host", "127.0.0.1"]
    except Exception:  # noqa: BLE001
        pass
    return cmd + extra


def fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def table(results: dict) -> str:
    rows = ["| system | output tok/s | TTFT mean (s) | TTFT p50 (s) | TTFT p90 (s) | ok/requests | early stops "
            "| same text as raw |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, rep in results.items():
        if "error" in rep:
            rows.append(f"| {name} | error: {rep['error'][:60]} | | | | | | |")
            continue
        s = rep["summary"]
        rows.append(f"| {name} | {fmt(s['output_tok_per_s'], 1)} | {fmt(s['ttft_mean_s'])} | {fmt(s['ttft_p50_s'])} | "
                    f"{fmt(s['ttft_p90_s'])} | {s['completed']}/{s['num_requests']} | {s.get('num_early_stops', 0)} "
                    f"| {rep.get('same_text_as_raw', '-')} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="transformers,omni,raw",
                    help="comma list of transformers, omni, raw (run in this order)")
    ap.add_argument("--size", default="100m", choices=["100m", "tiny"])
    ap.add_argument("--ckpt", type=Path, default=None, help="checkpoint dir (default bench/.cache/qwen2-<size>)")
    ap.add_argument("--num-requests", "-n", type=int, default=64)
    ap.add_argument("--concurrency", "-c", type=int, default=32)
    ap.add_argument("--max-tokens", "-m", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-words", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured warm-up requests per server")
    ap.add_argument("--model-name", default=None, help="model name to send (default: first id of /v1/models)")
    ap.add_argument("--omni-url", default=None, help="benchmark an already running omni-serve (…/v1); start nothing")
    ap.add_argument("--omni-args", default="", help="extra args for bin/omni-serve (one string)")
    ap.add_argument("--tserve-args", default="", help="extra args for transformers serve, e.g. '--cb-num-blocks 512'")
    ap.add_argument("--raw-args", default="", help="extra args for raw_loop.py, e.g. '--cache dynamic'")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--client-timeout", type=float, default=3600.0, help="global timeout of each measured load")
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/text_<date>.json")
    args = ap.parse_args(argv)

    def _sig(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _sig)

    from make_checkpoint import make_checkpoint

    ckpt = (args.ckpt or BENCH / ".cache" / f"qwen2-{args.size}").resolve()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results_dir = BENCH / "results"
    tmp = results_dir / "logs" / stamp
    tmp.mkdir(parents=True, exist_ok=True)
    out = args.out or results_dir / f"text_{stamp}.json"
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    results: dict[str, dict] = {}
    try:
        make_checkpoint(ckpt, args.size)
        for system in systems:
            load_before = os.getloadavg()
            try:
                if system == "transformers":
                    port = free_port()
                    exe = Path(sys.executable).parent / "transformers"
                    cmd = [str(exe) if exe.exists() else "transformers", "serve", "--continuous-batching",
                           "--device", "cpu", "--host", "127.0.0.1", "--port", str(port), *args.tserve_args.split(),
                           str(ckpt)]
                    results[TSERVE] = bench_server(
                        "transformers", cmd, f"http://127.0.0.1:{port}/v1", args, tmp, tmp)
                elif system == "omni":
                    if args.omni_url:
                        results[OMNI] = bench_server("omni", None, args.omni_url, args, tmp, tmp)
                    else:
                        port = free_port()
                        cmd = omni_cmd(ckpt, port, args.omni_args.split())
                        if cmd is None:
                            log("bin/omni-serve not found: skipping omni")
                            results[OMNI] = {"error": "bin/omni-serve not found (skipped)"}
                            continue
                        results[OMNI] = bench_server("omni", cmd, f"http://127.0.0.1:{port}/v1", args, tmp, tmp)
                elif system == "raw":
                    rep_path = tmp / "raw.json"
                    cmd = [sys.executable, str(BENCH / "raw_loop.py"), "--model", str(ckpt),
                           "-n", str(args.num_requests), "-b", str(args.concurrency), "-m", str(args.max_tokens),
                           "--seed", str(args.seed), "--prompt-words", str(args.prompt_words),
                           *args.raw_args.split(), "--out", str(rep_path)]
                    log(f"raw: {' '.join(cmd[1:])}")
                    subprocess.run(cmd, cwd=REPO, check=True, timeout=args.client_timeout)
                    results[RAW] = json.loads(rep_path.read_text())
                else:
                    raise ValueError(f"unknown system {system!r}")
            except (Exception, subprocess.SubprocessError) as e:  # noqa: BLE001 - keep going, report it
                log(f"{system} FAILED: {type(e).__name__}: {e}")
                results[NAMES.get(system, system)] = {"error": f"{type(e).__name__}: {e}"}
            # The host is shared: a 1-minute load average well above the work we put on it
            # (~2-3 runnable threads) means the numbers of that system are suspect.
            load_after = os.getloadavg()
            last = list(results.values())[-1] if results else None
            if last is not None:
                last["loadavg_before_after"] = [load_before, load_after]
            log(f"{system}: loadavg before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    finally:
        stop_all()

    # Informational cross-check: greedy text of each server vs the raw loop (same prompts, same
    # weights). Batched float32 numerics can flip a near-tie argmax on a random model, so a few
    # mismatches are not by themselves a bug; most requests differing is.
    raw = results.get(RAW)
    if raw and "requests" in raw:
        ref = {r["index"]: r["text_preview"] for r in raw["requests"]}
        for name, rep in results.items():
            if name == RAW or "requests" not in rep:
                continue
            same = sum(1 for r in rep["requests"] if r.get("ok") and ref.get(r["index"]) == r.get("text_preview"))
            rep["same_text_as_raw"] = f"{same}/{len(ref)}"
            log(f"{name}: greedy text identical to raw loop for {same}/{len(ref)} requests (first 120 chars)")

    md = table(results)
    print()
    print(f"Text serving benchmark: {ckpt.name}, {args.num_requests} chat requests, concurrency {args.concurrency}, "
          f"{args.max_tokens} output tokens each, {os.cpu_count()} CPU cores")
    print()
    print(md)
    report = {
        "date_utc": stamp,
        "checkpoint": str(ckpt),
        "checkpoint_spec": json.loads((ckpt / ".bench_ckpt.json").read_text()) if (ckpt / ".bench_ckpt.json").exists() else None,
        "host": {"cpus": os.cpu_count(), "platform": sys.platform},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "table_markdown": md,
        "results": results,
    }
    try:
        import torch
        import transformers

        report["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    except Exception:  # noqa: BLE001
        pass
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out}")
    ok = all("error" not in r or "not found" in r["error"] for r in results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
