from __future__ import annotations

import asyncio
import os
import socket
import uuid
from pathlib import Path

import pytest

from omni.cli.sd_notify import Notifier, socket_address


@pytest.fixture
def listener(tmp_path: Path):  # type: ignore[no-untyped-def]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(2)
    yield str(path), sock
    sock.close()


def test_message_is_newline_separated_lines_in_one_datagram(listener) -> None:  # type: ignore[no-untyped-def]
    path, sock = listener
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    notifier.notify("READY=1", "STATUS=serving 2 models")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving 2 models"
    notifier.close()


def test_abstract_socket() -> None:
    name = f"omni-test-{uuid.uuid4().hex}"
    assert socket_address("@" + name) == "\0" + name
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        notifier = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        notifier.notify("STOPPING=1")
        assert sock.recv(4096) == b"STOPPING=1"
        notifier.close()


def test_unset_socket_is_a_no_op() -> None:
    notifier = Notifier.from_env({"WATCHDOG_USEC": "1000000"})
    assert notifier.address is None and notifier.watchdog_interval is None
    notifier.notify("READY=1")  # nothing to send to, nothing raised
    asyncio.run(asyncio.wait_for(notifier.ping_watchdog(lambda: True), 120))  # returns at once; a hang guard


def test_variables_are_taken_out_of_the_environment() -> None:
    env = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid()), "PATH": "/bin"}
    notifier = Notifier.from_env(env)
    assert env == {"PATH": "/bin"}  # the workers inherit no socket
    assert notifier.watchdog_interval == 15.0


@pytest.mark.parametrize(
    ("usec", "pid", "interval"),
    [("1000000", None, 0.5), ("1000000", "1", None), ("", None, None), ("soon", None, None), ("0", None, None)],
)
def test_watchdog_interval(usec: str, pid: str | None, interval: float | None) -> None:
    env = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": usec}
    if pid is not None:
        env["WATCHDOG_PID"] = pid  # pid 1 is not us: another process pings
    assert Notifier.from_env(env, pid=4242).watchdog_interval == interval


def _received(sock: socket.socket) -> list[bytes]:
    """Every datagram already delivered to sock (a local datagram is queued when sent)."""
    sock.setblocking(False)
    got = []
    while True:
        try:
            got.append(sock.recv(4096))
        except BlockingIOError:
            return got


def test_pings_only_while_healthy_and_sleeps_the_interval_between(listener, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Three turns of the ping loop, healthy, not, healthy: two pings, and a sleep of the
    interval after each turn. The turns are counted, not timed: the test's sleep records its
    argument and the third health check ends the loop."""
    path, sock = listener
    notifier = Notifier(path, watchdog_interval=0.5)
    health = [True, False, True]
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr("omni.cli.sd_notify.asyncio.sleep", sleep)

    async def three_turns() -> None:
        turns = asyncio.Event()

        def healthy() -> bool:
            if len(health) == 1:
                turns.set()
            return health.pop(0)

        task = asyncio.create_task(notifier.ping_watchdog(healthy))
        await turns.wait()  # set on the third check; its ping is sent before the loop yields
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(three_turns())
    assert _received(sock) == [b"WATCHDOG=1", b"WATCHDOG=1"]
    assert slept[:2] == [0.5, 0.5]
    notifier.close()
