"""Start the real omni-serve as a subprocess on a free loopback port, for e2e tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


EAGER = ("--enforce-eager",)  # what the suite's servers run unless a test asks for the compiled step
COMPILED = ("--compile-decode",)
# The KV cache of a suite server that does not size its own (--num-kv-blocks, --kv-cache-memory):
# the CPU default is 2 GiB a model, committed at start (llm/memory.py), and each xdist worker
# keeps its session servers to the end: at 2 GiB each, CI's 24 GiB ran out in the suite's last
# minutes (mypy died of it). 512 MiB holds every tiny model's and SmolLM2's max_model_len.
KV_CACHE = ("--kv-cache-memory", str(512 << 20))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(base: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"omni-serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise TimeoutError("omni-serve did not become healthy")


def worker_pids(server_pid: int) -> list[int]:
    """The server's worker processes (spawned children, not multiprocessing's tracker)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    pids = []
    for pid in children:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            pids.append(int(pid))
    return pids


@contextlib.contextmanager
def workers_held(server_pid: int) -> Iterator[None]:
    """Hold the server's workers (SIGSTOP) until the block ends (SIGCONT), whatever happens in
    it: a gate, not a timing. While held, no step completes, so no request in flight finishes or
    leaves its queue, while the server process itself (admission, the API, /metrics) still
    answers. Only the workers stop; the test's own process never waits on them."""
    pids = worker_pids(server_pid)
    assert pids, "the server has no worker to hold"
    stopped: list[int] = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        for pid in stopped:  # a signal is delivered asynchronously: held once each shows "T"
            while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
                time.sleep(0.001)
        yield
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def wait_exited(pid: int, timeout: float = 300.0) -> None:
    """Until a killed child has exited (a zombie, or reaped): its pipes are closed by then, and
    its parent's Process.is_alive() answers False, so the server cannot place work on it.

    A zombie leader is not enough: the leader of a threaded process turns Z at once while its
    other threads still tear down (a worker's OpenMP threads, its gigabytes unmapped), and its
    parent's waitpid, so is_alive(), sees the exit only once the last thread is gone. So: the
    leader Z (or X) and its task list down to the leader alone, or the process reaped."""
    # a hang guard, not a timing: a SIGKILLed process exits in milliseconds; this only fails a test
    # that would otherwise wait forever (as long as the suite's other guards, for a loaded host)
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X") and len(os.listdir(f"/proc/{pid}/task")) <= 1:
                return
        except FileNotFoundError:
            return
        assert time.monotonic() < deadline, f"process {pid} did not exit"
        time.sleep(0.001)


def kv_cache(args: tuple[str, ...]) -> tuple[str, ...]:
    """KV_CACHE unless the server's arguments size the cache themselves."""
    sized = any(a.split("=")[0] in ("--num-kv-blocks", "--kv-cache-memory") for a in args)
    return () if sized else KV_CACHE


# base URL -> the server's process, for tests that need to reach its workers
PROCESSES: dict[str, subprocess.Popen[bytes]] = {}


@contextlib.contextmanager
def running_server(
    *args: str,
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    compiled: bool = False,
) -> Iterator[str]:
    """Yield the server's base URL (http://127.0.0.1:PORT) once /health answers 200.
    env: extra environment variables for the server (and so its workers); log: a file the
    server's output goes to (the test reads it), instead of the test's own output; compiled:
    the compiled decode step (else --enforce-eager, even where compiling is the default, as with
    int8: a cold inductor compile per server would cost the suite minutes; the tests that pass
    compiled=True prove that path)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMNI_LOG_LEVEL": "WARNING", **(env or {})}
    with contextlib.ExitStack() as files:
        out = files.enter_context(log.open("wb")) if log is not None else None
        proc = subprocess.Popen(
            [sys.executable, "-m", "omni.cli.main", "--port", str(port), "--num-threads", "1",
             *(COMPILED if compiled else EAGER), *kv_cache(args), *args],  # fmt: skip
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, timeout)
        PROCESSES[base] = proc
        yield base
    finally:
        PROCESSES.pop(base, None)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
