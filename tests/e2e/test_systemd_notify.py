"""The server under a fake systemd: a unix datagram socket as NOTIFY_SOCKET, a 1 s watchdog.
What it sends and in which order; the ping interval is a unit test's (tests/omni/cli/test_sd_notify.py)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e import server as e2e_server

WATCHDOG_USEC = 1_000_000  # pings every 0.5 s


def _health(base: str) -> int:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=120) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError):
        return 0  # not listening


class FakeSystemd:
    """Receives the server's notifications on a thread, each with its arrival time; on
    READY=1 it asks /health at once, so the test can tell READY never came early."""

    def __init__(self, path: Path, base: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.base = base
        self.messages: list[tuple[float, str]] = []
        self.health_at_ready: int | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._done.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            arrived = time.monotonic()
            for line in data.decode().split("\n"):
                if line == "READY=1":  # asked before READY=1 is listed: the test waits for the line
                    self.health_at_ready = _health(self.base)
                self.messages.append((arrived, line))

    def pings(self, start: float = 0.0, end: float = float("inf")) -> list[float]:
        return [t for t, line in self.messages if line == "WATCHDOG=1" and start <= t < end]

    def lines(self) -> list[str]:
        return [line for _, line in self.messages]

    def close(self) -> None:
        self._done.set()
        self._thread.join()
        self.sock.close()


def test_ready_watchdog_and_stopping(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = e2e_server.free_port()
    monkeypatch.setattr(e2e_server, "free_port", lambda: port)  # so the fake systemd knows the URL
    fake = FakeSystemd(tmp_path / "notify", f"http://127.0.0.1:{port}")
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    try:
        with e2e_server.running_server("--model", f"omni-tiny={tiny_model_dir}", env=env) as base:
            deadline = time.monotonic() + 120  # a hang guard
            while "READY=1" not in fake.lines() and time.monotonic() < deadline:
                time.sleep(0.05)
            lines = fake.lines()
            assert lines.index("STATUS=loading workers") < lines.index("READY=1")
            assert fake.health_at_ready == 200  # READY=1 only once /health is 200
            assert "STATUS=serving 1 model" in lines

            # The pings come, from the served process's loop, at WATCHDOG_USEC's half: how
            # often is tests/omni/cli/test_sd_notify.py's (no wall clock here, only a hang guard).
            deadline = time.monotonic() + 120  # a hang guard
            while len(fake.pings()) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(fake.pings()) >= 2, fake.lines()
            assert _health(base) == 200
        # running_server sent SIGTERM and waited for the exit.
        lines = fake.lines()
        assert "STOPPING=1" in lines and "STATUS=draining" in lines
        assert lines.index("READY=1") < lines.index("STOPPING=1")
    finally:
        fake.close()
