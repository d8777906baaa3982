"""The server's handle on one worker: spawn its process (or process group), wait for its ready
message, exchange messages.

A worker whose spec has world_size > 1 is a torch.distributed group of that many processes,
spawned together with one rendezvous address: rank 0 owns the message pipe, every other rank
holds a pipe of its own only so that its exit reads as EOF here. Any rank exiting is the
whole worker dying; kill() ends every rank, and the next start() spawns the group anew.

Reading is driven by the event loop (add_reader on the pipe's fd), so a slow worker never
blocks the server. A worker that exits closes its end of the pipe, which the reader sees as
EOF: every pending and later receive then raises WorkerDied.

The server's end is a non-blocking socket (uvloop makes any fd it watches non-blocking), so
multiprocessing's Connection, which assumes a blocking fd, cannot read or write it: a frame
larger than the socket buffer (a long prompt, a media item) would fail half-sent. This end
speaks Connection's framing itself, a 4-byte big-endian length (or -1 and an 8-byte length)
then the payload, with loop.sock_sendall and a receive buffer; the worker's end stays a
plain blocking Connection.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import socket
import struct
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from typing import Any

from gpu_workers.worker import Rendezvous, worker_main
from omni.shared import protocol

log = logging.getLogger("omni.engines.worker_process")


class WorkerDied(RuntimeError):
    pass


# Pieces of a frame shorter than this are joined into one send; a longer one is sent as itself.
_JOIN_BELOW = 1 << 16


def _coalesced(pieces: list[protocol.Piece]) -> Iterator[protocol.Piece]:
    """The pieces to send one after another: each run of short ones joined (a small frame is
    one send, header and all), each long one as it is (no copy of it on the loop)."""
    run: list[protocol.Piece] = []
    for piece in pieces:
        if len(piece) < _JOIN_BELOW:
            run.append(piece)
            continue
        if run:
            yield b"".join(run)
            run = []
        yield piece
    if run:
        yield b"".join(run)


class WorkerProcess:
    def __init__(
        self,
        spec: protocol.WorkerSpec,
        on_exit: Callable[[], None] | None = None,
        *,
        entry: Callable[..., None] = worker_main,
    ) -> None:
        """on_exit runs (in the event loop) when a process is seen to exit or hang up.
        entry is the processes' target (tests name one that registers a test runner first)."""
        self.spec = spec
        self._on_exit = on_exit
        self._entry = entry
        self.ready: Any = None  # the kind's ready message (spec.READY)
        self._processes: list[BaseProcess] = []
        self._sock: socket.socket | None = None
        self._lifelines: list[socket.socket] = []  # ranks > 0: EOF when one exits
        self._received = bytearray()
        self._send_lock = asyncio.Lock()
        self._inbox: asyncio.Queue[Any | None] | None = None
        self._dead = False
        # Set by stop(): the ranks' exits that follow are the stop's doing, not a fault.
        self._stopping = False

    @property
    def worker_id(self) -> int:
        return self.spec.worker_id

    @property
    def label(self) -> str:
        """How logs and errors name it: "llm worker 0", "encoder worker 0"."""
        return f"{self.spec.LABEL} {self.worker_id}"

    @property
    def is_alive(self) -> bool:
        return not self._dead and bool(self._processes) and all(p.is_alive() for p in self._processes)

    @property
    def pids(self) -> list[int | None]:
        return [p.pid for p in self._processes]

    async def start(self, timeout: float) -> Any:
        """Spawn the process(es) and wait for the ready message; raise WorkerDied with the
        reason if none comes."""
        ctx = mp.get_context("spawn")
        spec_bytes = protocol.encode(self.spec)
        world_size = self.spec.world_size
        # rank 0 binds the rendezvous port itself and hands it to the others (review D3)
        init_method = Rendezvous(ctx.Queue()) if world_size > 1 else None
        loop = asyncio.get_running_loop()
        self._received = bytearray()
        self._dead = False
        self._stopping = False
        self._inbox = asyncio.Queue()
        self._processes, self._lifelines = [], []
        for rank in range(world_size):
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            suffix = f"-rank{rank}" if world_size > 1 else ""
            process = ctx.Process(
                target=self._entry,
                args=(child_conn, spec_bytes, rank, init_method),
                name=f"omni-{self.spec.LABEL.replace(' ', '-')}-{self.worker_id}{suffix}",
                daemon=True,
            )
            process.start()
            self._processes.append(process)
            child_conn.close()  # so the worker's exit reads as EOF here
            # a duplex Pipe is a Unix socketpair: take the fd over as a socket
            sock = socket.socket(fileno=os.dup(parent_conn.fileno()))
            parent_conn.close()
            sock.setblocking(False)
            if rank == 0:
                self._sock = sock
                loop.add_reader(sock.fileno(), self._on_readable)
            else:
                self._lifelines.append(sock)
                loop.add_reader(sock.fileno(), self._on_lifeline, sock)
        try:
            message = await asyncio.wait_for(self.recv(), timeout)
        except TimeoutError:
            await self.kill()
            raise WorkerDied(f"{self.label} not ready after {timeout:.0f}s") from None
        if isinstance(message, protocol.WorkerError):
            await self.kill()
            raise WorkerDied(f"{self.label} failed to start: {message.message}")
        if not isinstance(message, self.spec.READY):
            await self.kill()
            raise WorkerDied(f"{self.label} sent {type(message).__name__} first")
        self.ready = message
        return message

    async def send(self, message: Any) -> None:
        if self._dead or self._sock is None:
            raise WorkerDied(f"{self.label} is not running")
        # A message's large bytes (a media item) are pieces of their own (protocol.encode_frame),
        # never copied into the msgpack buffer: one copy of a 30 MB image is a 30 ms stall here.
        pieces = protocol.encode_frame(message)
        size = protocol.frame_size(pieces)
        if size > 0x7FFFFFFF:
            header = struct.pack("!iQ", -1, size)
        else:
            header = struct.pack("!i", size)
        try:
            async with self._send_lock:  # frames must not interleave
                loop = asyncio.get_running_loop()
                for data in _coalesced([header, *pieces]):
                    await loop.sock_sendall(self._sock, data)
        except OSError as exc:
            self._mark_dead()
            raise WorkerDied(f"{self.label}: {exc}") from exc

    async def recv(self) -> Any:
        assert self._inbox is not None
        if self._dead and self._inbox.empty():
            raise WorkerDied(f"{self.label} exited")
        message = await self._inbox.get()
        if message is None:
            self._inbox.put_nowait(None)  # keep the EOF marker for later receivers
            raise WorkerDied(f"{self.label} exited (code {self.exitcode})")
        return message

    @property
    def exitcode(self) -> int | None:
        """The first exit code among the ranks that have exited."""
        return next((p.exitcode for p in self._processes if p.exitcode is not None), None)

    def _on_lifeline(self, sock: socket.socket) -> None:
        try:
            if sock.recv(1 << 12):
                return  # a follower rank writes nothing; ignore it if it does
        except BlockingIOError:
            return
        except OSError:
            pass
        if self._stopping:  # asked to exit: a follower may well go before its leader
            log.info("%s: a rank of its group exited while it stops", self.label)
        else:
            log.error("%s: a rank of its group exited", self.label)
        self._mark_dead()

    def _on_readable(self) -> None:
        assert self._sock is not None and self._inbox is not None
        gone = False
        try:
            while True:
                chunk = self._sock.recv(1 << 20)
                if not chunk:  # EOF: the worker is gone
                    gone = True
                    break
                self._received += chunk
        except BlockingIOError:
            pass  # drained for now
        except OSError:
            gone = True
        try:
            # frames that arrived before the EOF (e.g. a fatal WorkerError) still count
            while (message := self._next_frame()) is not None:
                self._inbox.put_nowait(message)
        except ValueError:
            log.exception("%s sent an undecodable frame", self.label)
            gone = True
        if gone:
            self._mark_dead()

    def _next_frame(self) -> Any | None:
        """The message of one whole frame off the receive buffer, or None until the rest arrives."""
        buf = self._received
        if len(buf) < 4:
            return None
        (size,) = struct.unpack_from("!i", buf, 0)
        start = 4
        if size == -1:
            if len(buf) < 12:
                return None
            (size,) = struct.unpack_from("!Q", buf, 4)
            start = 12
        elif size < 0:
            raise ValueError(f"bad frame length {size}")
        if len(buf) < start + size:
            return None
        # Decoded in place, not from a copy of the frame; the views are released before the
        # buffer shrinks (a bytearray with a view on it cannot be resized).
        with memoryview(buf) as view, view[start : start + size] as payload:
            message = protocol.decode(payload)
        del buf[: start + size]
        return message

    def _mark_dead(self) -> None:
        if self._dead:
            return
        self._dead = True
        for sock in [self._sock, *self._lifelines]:
            if sock is None:
                continue
            try:
                asyncio.get_running_loop().remove_reader(sock.fileno())
            except (OSError, ValueError, RuntimeError):
                pass
        if self._inbox is not None:
            self._inbox.put_nowait(None)
        if self._on_exit is not None:
            self._on_exit()

    async def stop(self, timeout: float = 10.0) -> None:
        """Ask the worker to exit; kill it if it does not within the timeout."""
        if not self._processes:
            return
        self._stopping = True
        if not self._dead:
            try:
                await self.send(protocol.Shutdown())
            except WorkerDied:
                pass
        deadline = asyncio.get_running_loop().time() + timeout
        leader = self._processes[0]
        while leader.is_alive() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        await self.kill()

    async def kill(self) -> None:
        """End every rank (a group lives and dies whole) and close the pipes."""
        self._mark_dead()
        loop = asyncio.get_running_loop()
        alive = [p for p in self._processes if p.is_alive()]
        for process in alive:
            process.kill()
        for process in alive:
            await loop.run_in_executor(None, process.join, 5.0)
        for sock in [self._sock, *self._lifelines]:
            if sock is not None:
                sock.close()
        self._sock, self._lifelines = None, []

