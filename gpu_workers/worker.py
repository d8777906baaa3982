"""The worker process: become the runner the spec names, say ready, then run jobs until told
to stop.

The server spawns this with multiprocessing's "spawn" start method and talks to it over one
duplex pipe carrying msgpack frames (omni/shared/protocol). The spec arrives as a protocol message
too, so nothing crossing the boundary is pickled by us. torch is imported only inside the
child (by the runner modules), never when the server imports this module to name the entry
point.

A job's exception fails only that job, unless it is a device error that leaves the device
unusable (is_fatal: a CUDA error other than out of memory, such as a device-side assert, which
is sticky): then the worker reports it and exits, so the supervisor starts a fresh process
instead of a worker that fails every later job while it looks alive (review A3).

A group worker (spec.world_size > 1) is world_size of these processes: rank 0 serves the
pipe, the other ranks follow it (Runner.follow) and hold their pipe only to notice the
server going away.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import traceback
from collections.abc import Iterator, MutableMapping
from multiprocessing.connection import Connection
from typing import Any

from gpu_workers.distributed import GroupMember, Rendezvous, destroy_group, init_group
from omni.shared import protocol
from omni.shared.log_format import setup_logging

log = logging.getLogger("omni.worker")


def worker_main(
    conn: Connection, spec_bytes: bytes, rank: int = 0, init_method: Rendezvous | str | None = None
) -> None:
    """Process entry point. Returns when told to shut down or when the server goes away."""
    # The server handles Ctrl-C and SIGTERM and shuts workers down in order, after in-flight
    # requests finish. A signal sent to the whole process group (a terminal's Ctrl-C,
    # `timeout`, systemd's default KillMode) must not kill a worker mid-drain. A worker still
    # exits when the server goes away: its pipe reads EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The server's level and format (--log-level, --log-format), passed down in the environment.
    setup_logging(os.environ.get("OMNI_LOG_LEVEL", "INFO"), os.environ.get("OMNI_LOG_FORMAT", "text"))
    spec = protocol.decode(spec_bytes)
    if not isinstance(spec, protocol.WorkerSpec):
        raise TypeError(f"a worker is started with a spec, got {type(spec).__name__}")
    member = GroupMember(rank, spec.world_size, init_method)
    _name_process(process_name(spec, rank))
    prepare_environment(spec, os.environ)
    try:
        runner = _build_runner(spec, member)
    except Exception as exc:  # start-up failure: tell the server why, then exit
        log.exception("%s %d (rank %d) failed to start", spec.LABEL, spec.worker_id, rank)
        _send(conn, protocol.WorkerError(f"{type(exc).__name__}: {exc}", fatal=True))
        return
    # What loading made (modules, the model, tokenizer tables) is out of the collector's sight:
    # a collection walks every tracked object, and with the startup heap in view each one took
    # 3-4 % of a one-sequence decode's CPU time (perf, docs/BENCHMARKS.md session 15).
    gc.collect()
    gc.freeze()
    try:
        if member.is_leader:
            _send(conn, runner.ready_message(spec))
            _serve(conn, runner)
        else:
            _exit_with_the_server(conn)
            runner.follow()
    finally:
        runner.close()
        destroy_group(member)


def process_name(spec: protocol.WorkerSpec, rank: int = 0) -> str:
    """What ps and top show for a worker: "omni-llm0", "omni-encoder0", "omni-vision0.1" (rank
    1 of a group); at most 15 characters, the kernel's limit."""
    name = f"omni-{spec.LABEL.split()[0]}{spec.worker_id}"
    if spec.world_size > 1:
        name += f".{rank}"
    return name[:15]


def _name_process(name: str) -> None:
    try:
        with open("/proc/self/comm", "w") as f:  # Linux; elsewhere the name stays python
            f.write(name)
    except OSError:
        pass


# torch threads of a GPU worker unless --num-threads says: its CPU work is launching kernels
# and small host tensors, and a pool the size of the machine in each of ~10 processes only
# crowds out the server's event loop (review C10; vLLM runs its GPU workers with one).
GPU_WORKER_THREADS = 4


def prepare_environment(spec: protocol.WorkerSpec, environ: MutableMapping[str, str]) -> None:
    """Before torch is imported: on a GPU, the caching allocator grows its segments in place
    rather than fragmenting into fixed ones, so the peaks of colocated workers fit (review A7),
    unless the user set PYTORCH_CUDA_ALLOC_CONF; and the OpenMP pool is bounded (C10)."""
    if not spec.device.startswith("cuda"):
        return
    environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    environ.setdefault("OMP_NUM_THREADS", str(spec.num_threads or GPU_WORKER_THREADS))


def worker_device(spec: protocol.WorkerSpec, rank: int) -> str:
    """This rank's device (a group's ranks may each have their own)."""
    device_of = getattr(spec, "device_of", None)
    return str(device_of(rank)) if device_of is not None else spec.device


def bind_device(spec: protocol.WorkerSpec, rank: int) -> None:
    """A GPU worker makes its device the current one first thing, so that whatever uses the
    current device (a kernel library, a synchronize, NCCL) uses its GPU, not GPU 0 (review D1)."""
    import torch  # noqa: PLC0415

    device = worker_device(spec, rank)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        torch.set_num_threads(spec.num_threads or GPU_WORKER_THREADS)
    elif spec.num_threads:
        torch.set_num_threads(spec.num_threads)


def _build_runner(spec: protocol.WorkerSpec, member: GroupMember) -> Any:
    import torch  # noqa: PLC0415 - only the child process may import torch

    from gpu_workers.runner import runner_class  # noqa: PLC0415

    bind_device(spec, member.rank)
    member = init_group(member, spec.device)  # with its hand-off group
    runner = runner_class(type(spec)).from_spec(spec, member)
    if worker_device(spec, member.rank).startswith("cuda"):
        runner.profile()  # on the CPU nothing shares a budget: tests call it themselves
    if spec.seed is not None:
        # After loading, whose module initialisation draws from the generator: sampling
        # then starts from the seed itself, whatever the model.
        torch.manual_seed(spec.seed)
    return runner


def _serve(conn: Connection, runner: Any) -> None:
    runner.receive = lambda: protocol.decode(conn.recv_bytes())  # EOF raises inside the job, then here
    while True:
        try:
            message = protocol.decode(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the server is gone
        if isinstance(message, protocol.Shutdown):
            return
        if not isinstance(message, runner.JOB):
            _send(conn, protocol.WorkerError(f"unexpected message {type(message).__name__}"))
            continue
        try:
            result = runner.run(message)
            if isinstance(result, Iterator):
                # A job with progress (the image decoder's previews): every message the
                # runner yields is sent as it comes; the last is the job's result.
                for reply in result:
                    _send(conn, reply)
                continue
        except Exception as exc:
            # The server fails the requests of this job and keeps the worker ...
            log.error("job %d failed:\n%s", message.job_id, traceback.format_exc())
            fatal = is_fatal(exc)
            _send(conn, protocol.WorkerError(f"{type(exc).__name__}: {exc}", job_id=message.job_id, fatal=fatal))
            if fatal:  # ... unless the device is lost: a new process gets a new context
                log.error("%s: the device is unusable after this error; exiting so the worker restarts", type(exc).__name__)
                logging.shutdown()
                os._exit(1)  # not a clean exit: the runner's close() could touch the broken device
            continue
        _send(conn, result)


# A CUDA error's text, when torch raises it as a plain RuntimeError (older releases, cuBLAS).
_DEVICE_ERROR_MARKS = ("CUDA error", "device-side assert", "CUBLAS_STATUS_", "cuDNN error", "NCCL error")


def is_fatal(exc: BaseException) -> bool:
    """A CUDA error other than out of memory, in exc or what caused it. Such errors are sticky:
    the context fails every later call (a device-side assert from an index out of range, an
    illegal address). Running out of memory is not: the job fails, the worker goes on."""
    import torch  # noqa: PLC0415 - in the worker, torch is loaded already

    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, torch.cuda.OutOfMemoryError):
            return False
        if isinstance(error, torch.AcceleratorError):
            return True
        if isinstance(error, RuntimeError) and any(mark in str(error) for mark in _DEVICE_ERROR_MARKS):
            return True
        error = error.__cause__ or error.__context__
    return False


def _exit_with_the_server(conn: Connection) -> None:
    """A follower rank's pipe carries nothing; its EOF means the server (or the group) is
    gone, and a follower blocked in a collective would otherwise wait forever."""

    def watch() -> None:
        try:
            conn.recv_bytes()
        except (EOFError, OSError):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="server-watch", daemon=True).start()


def _send(conn: Connection, message: Any) -> None:
    try:
        # encode joins the frame's pieces, blobs (an encoded image) included: one copy, as
        # msgpack made before. The server avoids it on its event loop; no client waits on this one.
        conn.send_bytes(protocol.encode(message))
    except (BrokenPipeError, OSError):
        pass  # the server is gone; the next recv ends the loop
