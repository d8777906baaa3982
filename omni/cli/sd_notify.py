"""The sd_notify protocol, spoken directly: newline-separated KEY=VALUE lines in one datagram to
the unix socket named by $NOTIFY_SOCKET (a leading "@" names one in the abstract namespace).

Outside systemd (NOTIFY_SOCKET unset) every call is a no-op. A failed send is logged and
dropped: telling systemd is never a reason for the server to fail.

The watchdog: systemd sets WATCHDOG_USEC (and WATCHDOG_PID, the process meant to ping) when the
unit has WatchdogSec=; a ping task on the event loop sends WATCHDOG=1 every half of it while a
health check holds. A blocked loop runs no task, so the pings stop and systemd restarts us.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, MutableMapping

log = logging.getLogger("omni.cli.sd_notify")

# What systemd hands the main process; taken out of the environment so that the worker
# processes (which inherit it) neither ping nor announce themselves.
_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def socket_address(name: str) -> str:
    """'@name' -> '\\0name' (the abstract namespace); a path stays a path."""
    return "\0" + name[1:] if name.startswith("@") else name


class Notifier:
    def __init__(self, address: str | None, watchdog_interval: float | None = None) -> None:
        self.address = address  # None: not under systemd, nothing is sent
        # Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC); None: no watchdog.
        self.watchdog_interval = watchdog_interval if address is not None else None
        self._sock: socket.socket | None = None

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str], pid: int | None = None) -> Notifier:
        """Read systemd's variables and remove them from `environ`."""
        values = {name: environ.pop(name, "") for name in _VARIABLES}
        address = socket_address(values["NOTIFY_SOCKET"]) if values["NOTIFY_SOCKET"] else None
        return cls(address, _watchdog_interval(values["WATCHDOG_USEC"], values["WATCHDOG_PID"], pid or os.getpid()))

    def notify(self, *lines: str) -> None:
        if self.address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:
            log.warning("sd_notify to %r failed: %s", self.address, exc)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def ping_watchdog(self, healthy: Callable[[], bool]) -> None:
        """WATCHDOG=1 every interval while healthy(); runs until cancelled. A ping costs one
        datagram and whatever healthy() costs (a few attribute reads)."""
        if self.watchdog_interval is None:
            return
        while True:
            if healthy():
                self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_interval)


def _watchdog_interval(usec: str, watchdog_pid: str, pid: int) -> float | None:
    """Half of WATCHDOG_USEC, in seconds; None when it is unset or meant for another process."""
    if not usec:
        return None
    if watchdog_pid and watchdog_pid != str(pid):
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not a number: no watchdog pings", usec)
        return None
    return value / 2e6 if value > 0 else None
