"""SupervisedWorker: the lifecycle every engine shares, around one worker (a process, or a
torch.distributed group of processes restarted as a whole).

    start() -> spawn, await the kind's ready message -> on_ready() -> the job loop task
    job loop: while not closing: worker gone? restart : run_once()
    restart: fail only the work that was on the worker -> kill -> spawn again with backoff
    stop(): cancel the loop -> fail everything still pending -> ask the worker to exit

A subclass says what a ready message means (on_ready), what one turn of its loop does
(run_once: schedule and send a job, or wait for work) and which of its requests die with the
worker (fail_on_worker) or with the server (fail_pending). The LLM and encoder engines are
such subclasses; the image decoder's group is the next.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ClassVar

from gpu_workers.worker import worker_main
from omni.engines.worker_process import WorkerDied, WorkerProcess
from omni.shared import protocol

log = logging.getLogger("omni.engines.supervisor")


class EngineError(RuntimeError):
    """A request could not be completed because its worker failed."""


class SupervisedWorker(ABC):
    # A worker that sizes itself from the GPU memory still free once it has loaded (the LLM's
    # KV cache) starts after the others, one at a time per GPU (omni/engines/start_order.py).
    sizes_from_free_memory: ClassVar[bool] = False

    def __init__(
        self,
        spec: protocol.WorkerSpec,
        *,
        name: str,
        start_timeout: float,
        entry: Callable[..., None] = worker_main,
    ) -> None:
        self.spec = spec
        self.name = name  # for logs: "<model> llm worker 0"
        self.start_timeout = start_timeout
        # A worker that dies while the engine idles must still be noticed and restarted.
        self._wakeup = asyncio.Event()
        self.worker = WorkerProcess(spec, on_exit=self._wakeup.set, entry=entry)
        self._ready = False
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self._ready and self.worker.is_alive

    def use_spec(self, spec: protocol.WorkerSpec) -> None:
        """The spec the next (re)start sends (the start order's memory shares)."""
        self.spec = spec
        self.worker.spec = spec

    async def start(self) -> None:
        await self._start_worker()
        self._task = asyncio.create_task(self._run(), name=f"engine-{self.name}")

    async def stop(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.fail_pending(EngineError("server shutting down"))
        await self.worker.stop()

    # ---- what a subclass decides -----------------------------------------------------
    @abstractmethod
    def on_ready(self, ready: Any) -> None:
        """The worker (re)started and sent its ready message: (re)build what depends on it."""

    @abstractmethod
    async def run_once(self) -> None:
        """One turn of the job loop: run a job on the worker, or wait for work (wait_for_work).
        Raises WorkerDied when the worker is lost; anything else it must handle itself."""

    @abstractmethod
    def fail_on_worker(self, error: EngineError) -> None:
        """The worker died: fail the requests whose state died with it (and only those)."""

    def fail_pending(self, error: EngineError) -> None:
        """The server is stopping: fail every request not yet answered."""
        self.fail_on_worker(error)

    # ---- the shared machinery --------------------------------------------------------
    async def wait_for_work(self) -> None:
        """Sleep until submit(), an abort or the worker's exit calls wake()."""
        self._wakeup.clear()
        await self._wakeup.wait()

    def wake(self) -> None:
        self._wakeup.set()

    async def _start_worker(self) -> None:
        ready = await self.worker.start(timeout=self.start_timeout)
        self.on_ready(ready)
        self._ready = True

    async def _run(self) -> None:
        while not self._closing:
            if not self.worker.is_alive:
                await self._restart(WorkerDied(f"{self.worker.label} exited (code {self.worker.exitcode})"))
                continue
            try:
                await self.run_once()
            except WorkerDied as exc:
                await self._restart(exc)

    async def _restart(self, cause: BaseException) -> None:
        self._ready = False
        log.error("%s: %s; restarting it", self.name, cause)
        self.fail_on_worker(EngineError(f"{self.spec.LABEL} failed: {cause}"))
        await self.worker.kill()
        await restart_until_up(self._start_worker, lambda: self._closing, self.name)


def fail_futures(futures: Iterable[asyncio.Future[Any]], error: BaseException) -> None:
    """Fail every future not yet done; its exception counts as retrieved, since its waiter may
    be gone (a client that left)."""
    for future in futures:
        if not future.done():
            future.set_exception(error)
            future.exception()


async def restart_until_up(
    start: Callable[[], Awaitable[None]], closing: Callable[[], bool], what: str
) -> None:
    """Call start() until it succeeds or closing() is true, backing off from 1 s to 30 s."""
    delay = 1.0
    while not closing():
        try:
            await start()
            return
        except WorkerDied as exc:
            log.error("%s: restart failed: %s", what, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
