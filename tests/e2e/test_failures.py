"""Start-up failures are clear; a worker that dies fails only its requests and comes back."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import EAGER, PROCESSES, ROOT, free_port, running_server, wait_healthy, worker_pids


def _start(model_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omni.cli.main", "--model", str(model_dir), "--port", str(free_port())],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda d: (d / "config.json").write_text(json.dumps({"model_type": "gpt2"})), "gpt2"),
        (lambda d: (d / "model.safetensors").write_bytes(b"not a safetensors file"), "safetensors"),
        (lambda d: (d / "tokenizer.json").unlink(), "tokenizer"),
    ],
    ids=["unknown-model-type", "corrupt-weights", "no-tokenizer"],
)
def test_malformed_checkpoint_fails_at_start(tmp_path: Path, tiny_model_dir: Path, breakage, message: str) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    breakage(broken)
    result = _start(broken)
    assert result.returncode == 1  # serve()'s "could not start"
    assert message in result.stderr.lower()
    assert "Traceback" not in result.stderr.split("could not start")[-1]


BESIDE = 15  # streams running beside the one that sees the kill


def streams_beside(base: str, body: dict[str, object], n: int) -> tuple[list[threading.Thread], list[tuple[float, str]]]:
    """n streams of body started and each past its first event: their threads, and the list
    each appends to as it ends (when, its last event before [DONE])."""
    ended: list[tuple[float, str]] = []
    first_events = threading.Semaphore(0)

    def stream() -> None:
        last = ""
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    if not last:
                        first_events.release()
                    last = line[6:]
        ended.append((time.monotonic(), last))

    threads = [threading.Thread(target=stream) for _ in range(n)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert first_events.acquire(timeout=120)  # a hang guard, as those below
    return threads, ended


def test_worker_crash_fails_its_requests_then_recovers(tiny_model_dir: Path) -> None:
    with running_server("--model", f"m={tiny_model_dir}", "--num-kv-blocks", "256") as base:
        server_pid = PROCESSES[base].pid
        # Seeded, so the restarted worker must answer exactly as the first one did; a prompt
        # over one block (16 tokens), so the first worker's prefix cache holds a block of it.
        hi = {
            "model": "m",
            "messages": [{"role": "user", "content": "Say hi to everyone in the room, please."}],
            "max_tokens": 4,
            "seed": 5,
        }
        before = httpx.post(f"{base}/v1/chat/completions", json=hi, timeout=120).json()
        assert before["usage"]["prompt_tokens"] > 16
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 2000,
            "seed": 6,
            "ignore_eos": True,  # still running when the worker is killed after 3 events
            "stream": True,
        }
        # Under load: more streams running beside the one that sees the kill.
        beside, others = streams_beside(base, body, BESIDE)
        events = []
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 3:
                    (worker,) = worker_pids(server_pid)
                    os.kill(worker, signal.SIGKILL)
                    killed = time.monotonic()
        for thread in beside:
            thread.join(timeout=120)
        assert len(others) == BESIDE
        assert all(json.loads(last)["error"]["code"] == "service_unavailable" for _, last in others)
        failed_within = max(at for at, _ in others) - killed
        assert events[-1] == "[DONE]"
        # The stream's status was sent already: the 503 the server maps EngineError to
        # (api/sse.py: service_unavailable) comes as its last event.
        error = json.loads(events[-2])["error"]
        assert error["type"] == "server_error"
        assert error["code"] == "service_unavailable"
        assert error["param"] is None
        # "<kind> failed: <cause>", the cause naming the worker (pipe closed or exit code)
        assert error["message"].startswith("llm worker failed: llm worker 0")
        deadline = time.monotonic() + 120
        while httpx.get(f"{base}/health", timeout=120).status_code != 200:
            assert time.monotonic() < deadline, "the worker was not restarted"
            time.sleep(0.2)
        print(
            f"\nkill -9 under {BESIDE + 1} streams: the others failed within {failed_within:.2f} s; "
            f"healthy again {time.monotonic() - killed:.1f} s after the kill"
        )
        ok = httpx.post(f"{base}/v1/chat/completions", json=hi, timeout=120)
        assert ok.status_code == 200
        after = ok.json()
        assert after["choices"][0]["finish_reason"] == "length"
        assert after["usage"]["completion_tokens"] == 4
        # The KV cache died with the old worker: nothing may be reported (or read) as cached.
        assert after["usage"] == before["usage"]
        assert before["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert after["choices"] == before["choices"]


def test_sigterm_to_the_process_group_drains_in_flight_requests(tiny_model_dir: Path) -> None:
    """As systemd or `timeout` stop it: every process of the group gets SIGTERM at once."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni.cli.main", "--model", f"m={tiny_model_dir}", "--port", str(port),
         "--num-threads", "1", "--num-kv-blocks", "256", *EAGER],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), OMNI_LOG_LEVEL="WARNING"),
        start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, 120)
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "Keep going."}],
            "max_tokens": 160,
            "ignore_eos": True,
            "stream": True,
        }
        # Seven streams beside the one that sees the signal: all of them are drained.
        beside, ended = streams_beside(base, body, 7)
        events = []
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 3:
                    os.killpg(proc.pid, signal.SIGTERM)
                    signalled = time.monotonic()
        for thread in beside:
            thread.join(timeout=120)
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert "error" not in last
        assert last["choices"][0]["finish_reason"] == "length"
        assert [json.loads(last)["choices"][0]["finish_reason"] for _, last in ended] == ["length"] * 7
        assert proc.wait(timeout=300) == 0
        print(f"\nSIGTERM: 8/8 streams drained to their end, exit 0 {time.monotonic() - signalled:.1f} s after the signal")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()



def test_a_clean_stop_with_a_decoder_group_logs_no_error(omni_dir: Path, tmp_path: Path) -> None:
    """SIGTERM to a server with an image decoder group of two ranks: the server stops them,
    their lifelines close, and none of that is a fault. It logged "ERROR ... a rank of its group
    exited" when a follower went before its leader; which goes first is the processes' race, so
    tests/omni/engines/test_supervisor.py forces that order; this is the whole server's check."""
    log = tmp_path / "server.log"
    args = ("--model", f"omni={omni_dir}", "--max-model-len", "2048", "--vision-decoder-devices", "cpu,cpu",
            "--no-audio-output")  # fmt: skip
    with running_server(*args, log=log, env={"OMNI_LOG_LEVEL": "INFO"}) as base:
        proc = PROCESSES[base]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 0
    text = log.read_text(errors="replace")
    assert "shutting down" in text
    assert [line for line in text.splitlines() if " ERROR " in line or "Traceback" in line] == []
    # the group's layout, said at start: the checkpoint guides, so its 2 ranks run the 2 passes at once
    assert "image decoder of omni: 2 devices = 2 guidance groups (transformer | transformer2) x 1 Ulysses rank" in text
