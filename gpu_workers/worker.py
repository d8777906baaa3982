"""The worker process: load a runner, say Ready, then execute steps until told to stop.

The server spawns this with multiprocessing's "spawn" start method and talks to it over one
duplex pipe carrying msgpack frames (gpu_workers.protocol). The spec arrives as msgpack
bytes too, so nothing crossing the boundary is pickled by us. torch is imported only inside
the child, never when the server imports this module to name the entry point.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import msgpack

from gpu_workers import protocol

log = logging.getLogger("omni.worker")


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    worker_id: int
    model_dir: str
    device: str = "cpu"
    dtype: str = "float32"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_model_len: int | None = None
    attention_backend: str = "auto"
    num_threads: int | None = None
    # "llm" runs Steps (LLMRunner); "encoder" runs EncodeBatches (EncoderRunner) over the
    # component directories under model_dir.
    kind: str = "llm"
    # The artifact store (omni/store/spec.py syntax; "" is the default local one) that
    # encoders write and the LLM reads; None for a text-only LLM, which opens none.
    store: str | None = None
    store_endpoint_url: str | None = None
    store_region: str | None = None
    embedding_cache_bytes: int = 1024**3
    # omni.media.MediaLimits fields the encoder worker decodes under (server's values).
    media_limits: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return msgpack.packb(dataclasses.asdict(self), use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> WorkerSpec:
        fields: dict[str, Any] = msgpack.unpackb(data, raw=False)
        return cls(**fields)


def worker_main(conn: Connection, spec_bytes: bytes) -> None:
    """Process entry point. Returns when told to shut down or when the server goes away."""
    # The server handles Ctrl-C and SIGTERM and shuts workers down in order, after in-flight
    # requests finish. A signal sent to the whole process group (a terminal's Ctrl-C,
    # `timeout`, systemd's default KillMode) must not kill a worker mid-drain. A worker still
    # exits when the server goes away: its pipe reads EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(
        level=os.environ.get("OMNI_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
    )
    spec = WorkerSpec.from_bytes(spec_bytes)
    try:
        runner = _build_runner(spec)
    except Exception as exc:  # start-up failure: tell the server why, then exit
        log.exception("worker %d failed to start", spec.worker_id)
        _send(conn, protocol.WorkerError(f"{type(exc).__name__}: {exc}", fatal=True))
        return
    if spec.kind == "encoder":
        ready = protocol.Ready(spec.worker_id, spec.device, 0, 0, 0, list(runner.components))
    else:
        ready = protocol.Ready(
            worker_id=spec.worker_id,
            device=spec.device,
            num_kv_blocks=runner.num_kv_blocks,
            block_size=runner.block_size,
            max_model_len=runner.max_model_len,
        )
    _send(conn, ready)
    _serve(conn, runner)


def _build_runner(spec: WorkerSpec) -> Any:
    import torch  # noqa: PLC0415 - only the child process may import torch

    from gpu_workers.store_client import StoreClient  # noqa: PLC0415

    if spec.num_threads:
        torch.set_num_threads(spec.num_threads)
    store = None
    if spec.store is not None:
        store = StoreClient(spec.store, endpoint_url=spec.store_endpoint_url, region=spec.store_region)
    if spec.kind == "encoder":
        if store is None:
            raise ValueError("an encoder worker needs an artifact store")
        from gpu_workers.encoder_runner import EncoderRunner  # noqa: PLC0415
        from omni.media import MediaLimits  # noqa: PLC0415

        return EncoderRunner(
            spec.model_dir,
            store=store,
            device=spec.device,
            dtype=getattr(torch, spec.dtype),
            limits=MediaLimits(**spec.media_limits),
        )
    from gpu_workers.llm_runner import LLMRunner  # noqa: PLC0415

    return LLMRunner(
        model_dir=spec.model_dir,
        device=spec.device,
        dtype=getattr(torch, spec.dtype),
        block_size=spec.block_size,
        num_kv_blocks=spec.num_kv_blocks,
        kv_cache_memory_bytes=spec.kv_cache_memory_bytes,
        max_model_len=spec.max_model_len,
        attention_backend=spec.attention_backend,
        read_artifact=store.get if store is not None else None,
        embedding_cache_bytes=spec.embedding_cache_bytes,
    )


def _serve(conn: Connection, runner: Any) -> None:
    while True:
        try:
            message = protocol.decode(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the server is gone
        if isinstance(message, protocol.Shutdown):
            return
        if isinstance(message, protocol.Step):
            handle, job_id = runner.execute, message.step_id
        elif isinstance(message, protocol.EncodeBatch):
            handle, job_id = runner.encode, message.batch_id
        else:
            _send(conn, protocol.WorkerError(f"unexpected message {type(message).__name__}"))
            continue
        try:
            result = handle(message)
        except Exception as exc:
            # The server fails the requests of this step (or batch) and keeps the worker.
            log.error("job %d failed:\n%s", job_id, traceback.format_exc())
            _send(conn, protocol.WorkerError(f"{type(exc).__name__}: {exc}", step_id=job_id))
            continue
        _send(conn, result)


def _send(conn: Connection, message: protocol.Message) -> None:
    try:
        conn.send_bytes(protocol.encode(message))
    except (BrokenPipeError, OSError):
        pass  # the server is gone; the next recv ends the loop
