#!/usr/bin/env python3
"""What one decode step costs the server process at one user: CPU time per streamed token.

Starts bin/omni-serve on --model (its worker does the forward in a child process), warms it
up, then sends --requests chat completions one at a time, each streamed, --max-tokens tokens
with ignore_eos. It reads the server process's own CPU time (user + system, all its threads,
not the worker's: /proc/PID/stat) before and after, and divides by the tokens streamed. That is
everything the server pays per step: the step loop (schedule, the Step's encoding, the
StepResult's decoding, the scheduler's update), detokenization, the SSE chunk's building and
writing, the HTTP layer, the event loop itself. The worker's side is bench/step_profile.py's
(--seqs 1).

With --py-spy SECONDS it also samples the server process for that long while requests stream
(py-spy, the bench extra, with --gil: only the thread holding the GIL, so waits are left
out; C work that releases the GIL, as the socket writes may, is not seen) and prints, per
function, the milliseconds a token it holds the GIL itself (own) and under it (total): the
per-token figure's breakdown.

    python bench/server_step_cost.py --model ~/.cache/omni-serve/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --dtype bfloat16 --threads 2 --requests 4 --max-tokens 128 --rounds 3 --py-spy 20

--parts times the Python pieces of a step in-process, one request at a time, without a server
(best of many): the scheduler's schedule() and update_from_output(), the Step's building
(step_message) and its encoding, the StepResult's decoding, the detokenizer's push of one
token (the model's tokenizer), and one chat chunk's building and JSON encoding. What they do
not cover (the event loop, the sockets' syscalls, metrics, the handler's plumbing) is the
rest of the CPU figure above.

--rounds repeats the measurement (the same server) and reports the best round, as the machine
is shared. --json FILE writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from run_text_bench import free_port, wait_ready  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (every thread of it), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def stream_one(base: str, model: str, max_tokens: int, prompt: str) -> int:
    """One streamed chat completion; returns the content chunks it carried."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    req = urllib.request.Request(
        f"{base}/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    chunks = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if line.startswith(b"data: {") and b'"content"' in line:
                chunks += 1
    return chunks


SPY_RATE = 250  # samples a second


def py_spy_profile(pid: int, seconds: float, out: Path) -> tuple[Counter[str], Counter[str]]:
    """Samples of the thread holding the GIL (py-spy --gil: idle waits, which release it, are
    not counted), by function (file and name, lines merged): (own, total)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    subprocess.run(
        [exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", str(SPY_RATE), "--gil", "-f", "raw",
         "-o", str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [f.rsplit(":", 1)[0] + ")" if ":" in f else f for f in stack.split(";")]
        own[frames[-1]] += int(count)
        for f in set(frames):
            total[f] += int(count)
    return own, total


def best_us(fn: Any, n: int = 3000) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 10] * 1e6  # the 10th percentile: best-of, without the outliers


def parts(model_path: str) -> dict[str, float]:
    """The step's Python pieces on the server, in microseconds (see the module's --parts)."""
    sys.path.insert(0, str(REPO))
    import msgspec

    from omni.engines.step import step_message
    from omni.serving.bodies import ChatChunkChoice, ChatCompletionChunk, ChunkDelta
    from omni.shared import protocol
    from omni.text.detokenizer import IncrementalDetokenizer
    from omni.text.tokenizer import TextTokenizer
    from scheduler.block_manager import BlockManager
    from scheduler.request import Request, RequestId, SamplingParams
    from scheduler.scheduler import Scheduler, SchedulerConfig

    path = Path(model_path)
    tokenizer = TextTokenizer.from_gguf(path) if path.suffix == ".gguf" else TextTokenizer.from_dir(path)
    n = 3000
    sched = Scheduler(SchedulerConfig(64, 2048, 8192), BlockManager(1024, 16))
    request = Request(RequestId("r"), list(range(100, 164)), SamplingParams(max_tokens=10 * n), eos_token_ids=frozenset())
    sched.add_request(request)
    first = sched.schedule()
    sched.update_from_output(first, {RequestId("r"): 200})
    state: dict[str, Any] = {}
    tokens = [tokenizer.encode(" the quick brown fox jumps over the lazy dog")[i % 9] for i in range(n)]
    i = [0]

    def schedule() -> None:
        state["output"] = sched.schedule()

    def update() -> None:
        sched.update_from_output(state["output"], {RequestId("r"): tokens[i[0] % n]})
        i[0] += 1

    out: dict[str, float] = {}
    t_sched, t_update = [], []
    for _ in range(n):
        t = time.perf_counter()
        schedule()
        t_sched.append(time.perf_counter() - t)
        step = step_message(state["output"], [])
        state["step"] = step
        t = time.perf_counter()
        update()
        t_update.append(time.perf_counter() - t)
    out["scheduler schedule()"] = sorted(t_sched)[n // 10] * 1e6
    out["scheduler update_from_output()"] = sorted(t_update)[n // 10] * 1e6
    sched.schedule()  # one more, for the Step below
    output = sched.schedule()
    out["step_message()"] = best_us(lambda: step_message(output, []))
    step = step_message(output, [])
    out["Step encode"] = best_us(lambda: protocol.encode_frame(step))
    result = protocol.encode(protocol.StepResult(step.step_id, [protocol.SampledToken("r", 1234)]))
    out["StepResult decode"] = best_us(lambda: protocol.decode(result))
    detok = IncrementalDetokenizer(tokenizer, list(range(100, 164)))
    j = [0]

    def push() -> None:
        detok.push([tokens[j[0] % n]])
        j[0] += 1

    out["detokenizer push (1 token)"] = best_us(push)
    created = int(time.time())

    def chunk() -> bytes:
        body = ChatCompletionChunk("chatcmpl-0123456789abcdef", "chat.completion.chunk", created, "model",
                                   [ChatChunkChoice(0, ChunkDelta(content=" fox"), None, None)])  # fmt: skip
        return b"data: " + msgspec.json.encode(body) + b"\n\n"

    out["SSE chat chunk build + encode"] = best_us(chunk)
    print("\nin-process, one request, us (10th percentile of 3,000):")
    for k, v in out.items():
        print(f"  {k:<34} {v:7.1f}")
    print(f"  {'sum':<34} {sum(out.values()):7.1f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=4, help="streamed requests a round, one at a time")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="0: no server (with --parts)")
    ap.add_argument("--py-spy", type=float, default=0.0, help="seconds of py-spy sampling (0: none)")
    ap.add_argument("--omni-args", default="", help="more bin/omni-serve flags (one string)")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--parts", action="store_true", help="also time the step's Python pieces in-process")
    args = ap.parse_args()
    pieces = parts(args.model) if args.parts else {}
    if args.rounds == 0:  # --parts alone: no server
        if args.json:
            args.json.write_text(json.dumps({"model": args.model, "parts_us": pieces}, indent=2))
        return

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below stops the server
    port = free_port()
    cmd = [str(REPO / "bin" / "omni-serve"), "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", args.dtype, "--num-threads", str(args.threads), *args.omni_args.split()]  # fmt: skip
    env = {**os.environ, "OMNI_PYTHON": os.environ.get("OMNI_PYTHON", sys.executable)}
    tmp = Path(tempfile.mkdtemp(prefix="server-step-cost-"))
    logf = open(tmp / "server.log", "w")
    server = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}/v1"
        model = wait_ready(base, server, args.ready_timeout, None)
        stream_one(base, model, 16, "warm up")
        rounds = []
        for r in range(args.rounds):
            tokens = 0
            t, c = time.perf_counter(), cpu_seconds(server.pid)
            for i in range(args.requests):
                tokens += stream_one(base, model, args.max_tokens, f"Tell me a story about the number {r * 100 + i}.")
            wall, cpu = time.perf_counter() - t, cpu_seconds(server.pid) - c
            rounds.append({"tokens": tokens, "wall_s": wall, "cpu_s": cpu, "cpu_ms_per_token": 1e3 * cpu / tokens,
                           "tok_s": tokens / wall})  # fmt: skip
            print(f"round {r}: {tokens} tokens in {wall:.1f} s ({tokens / wall:.1f} tok/s); server CPU "
                  f"{cpu:.2f} s = {1e3 * cpu / tokens:.3f} ms a token", flush=True)  # fmt: skip
        best = min(rounds, key=lambda x: x["cpu_ms_per_token"])
        print(f"\nbest of {args.rounds}: the server process spends {best['cpu_ms_per_token']:.3f} ms of CPU a token")
        spy: dict[str, Any] = {}
        if args.py_spy:
            done = threading.Event()
            streamed = [0]

            def load() -> None:
                while not done.is_set():
                    streamed[0] += stream_one(base, model, args.max_tokens, "Tell me a long story.")

            th = threading.Thread(target=load, daemon=True)
            th.start()
            time.sleep(1.0)
            before = streamed[0]
            own, total = py_spy_profile(server.pid, args.py_spy, tmp / "spy.txt")
            tokens = max(1, streamed[0] - before)  # tokens whose chunks ended in the window, near enough
            done.set()
            th.join()
            ms = 1e3 / SPY_RATE / tokens  # one sample's share of a token, in ms
            print(f"\npy-spy --gil over {args.py_spy:.0f} s, {tokens} tokens: ms a token holding the GIL "
                  f"(all: {sum(own.values()) * ms:.3f})\n  own     total   function")  # fmt: skip
            seen = set()
            for f, _ in own.most_common(20) + total.most_common(45):
                if f not in seen:
                    seen.add(f)
                    print(f"  {own[f] * ms:6.3f}  {total[f] * ms:6.3f}  {f}")
            spy = {"tokens": tokens, "gil_ms_per_token": sum(own.values()) * ms,
                   "own_ms": {f: c * ms for f, c in own.most_common(40)},
                   "total_ms": {f: c * ms for f, c in total.most_common(60)}}  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps({"model": args.model, "dtype": args.dtype, "rounds": rounds,
                                             "py_spy": spy, "parts_us": pieces}, indent=2))  # fmt: skip
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        logf.close()


if __name__ == "__main__":
    main()
