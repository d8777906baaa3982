"""The server end of a worker pipe parses multiprocessing's framing from any split of bytes,
and a frame with large bytes (sent out of band, protocol.encode_frame) crosses a real pipe
both ways."""

from __future__ import annotations

import asyncio
import os
import struct
from multiprocessing.connection import Connection

import pytest

from gpu_workers import worker
from omni.engines.worker_process import WorkerProcess
from omni.shared import protocol
from omni.shared.protocol import LLMWorkerSpec, wire


def messages_of(data: bytes, cut_every: int) -> list[object]:
    proc = WorkerProcess(LLMWorkerSpec(worker_id=0, model_dir="unused"))
    out = []
    for i in range(0, len(data), cut_every):  # bytes arrive in arbitrary pieces
        proc._received += data[i : i + cut_every]
        while (message := proc._next_frame()) is not None:
            out.append(message)
    assert not proc._received
    return out


def frame(payload: bytes) -> bytes:
    return struct.pack("!i", len(payload)) + payload


def test_frames_split_anywhere_are_reassembled() -> None:
    big = protocol.StepResult(7, [protocol.SampledToken("r" * 300_000, 5)])
    stream = frame(protocol.encode(big)) + frame(protocol.encode(protocol.Shutdown()))
    for cut in (1, 3, 4096, len(stream)):
        assert messages_of(stream, cut) == [big, protocol.Shutdown()]


def test_an_enveloped_frame_split_anywhere_is_reassembled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "BLOB_MIN_BYTES", 8)  # blobs, and still cheap to feed byte by byte
    item = protocol.EncodeItem(1, "vision_encoder", "image", "k", b"0123456789" * 50, None, "image")
    batch = protocol.EncodeBatch(3, [item, item])
    payload = protocol.encode(batch)
    assert payload[0] == 0xC1
    stream = frame(payload) + frame(protocol.encode(protocol.Shutdown())) + frame(payload)
    for cut in (1, 7, len(stream)):
        assert messages_of(stream, cut) == [batch, protocol.Shutdown(), batch]


def test_the_long_length_header_is_read() -> None:
    payload = protocol.encode(protocol.Shutdown())
    stream = struct.pack("!iQ", -1, len(payload)) + payload
    assert messages_of(stream, 5) == [protocol.Shutdown()]


def test_an_undecodable_frame_leaves_the_buffer_free_to_resize() -> None:
    proc = WorkerProcess(LLMWorkerSpec(worker_id=0, model_dir="unused"))
    proc._received += frame(struct.pack("!BQ", 0xC1, 99) + b"\x90")
    with pytest.raises(ValueError, match="frame envelope"):
        proc._next_frame()
    del proc._received[:]  # no view of it outlives the decode


class Echo:
    """A runner without a model (and without torch): every batch comes back as it went."""

    JOB = protocol.EncodeBatch

    def run(self, job: protocol.EncodeBatch) -> protocol.EncodeBatch:
        return job


def echo_main(conn: Connection, spec_bytes: bytes, rank: int = 0, init_method: str | None = None) -> None:
    spec = protocol.decode(spec_bytes)
    worker._send(conn, protocol.EncoderReady(spec.worker_id, "cpu", []))
    worker._serve(conn, Echo())


async def test_large_bytes_cross_a_real_pipe_both_ways() -> None:
    proc = WorkerProcess(protocol.EncoderWorkerSpec(worker_id=0, model_dir="unused"), entry=echo_main)
    await proc.start(timeout=60)
    try:
        data = os.urandom(3 << 20)  # far past a socket buffer: partial sends on both sides
        batch = protocol.EncodeBatch(1, [
            protocol.EncodeItem(0, "vision_encoder", "image", "k0", data, None, "image"),
            protocol.EncodeItem(1, "audio_encoder", "audio", "k1", b"RIFF", "wav", "audio"),
            protocol.EncodeItem(2, "vision_encoder", "image", "k2", data[: wire.BLOB_MIN_BYTES], None, "image"),
        ])  # fmt: skip
        assert len(protocol.encode_frame(batch)) == 4  # envelope, head, two blobs
        for _ in range(2):
            await proc.send(batch)
            await proc.send(protocol.EncodeBatch(2, []))  # a small frame right behind a large one
            assert await asyncio.wait_for(proc.recv(), 30) == batch
            assert await asyncio.wait_for(proc.recv(), 30) == protocol.EncodeBatch(2, [])
    finally:
        await proc.stop()
