"""The server end of a worker pipe parses multiprocessing's framing from any split of bytes."""

from __future__ import annotations

import struct

from omni import protocol
from omni.protocol import LLMWorkerSpec
from omni.worker_process import WorkerProcess


def frames_of(data: bytes, cut_every: int) -> list[bytes]:
    proc = WorkerProcess(LLMWorkerSpec(worker_id=0, model_dir="unused"))
    out = []
    for i in range(0, len(data), cut_every):  # bytes arrive in arbitrary pieces
        proc._received += data[i : i + cut_every]
        while (frame := proc._next_frame()) is not None:
            out.append(frame)
    assert not proc._received
    return out


def test_frames_split_anywhere_are_reassembled() -> None:
    big = protocol.encode(protocol.StepResult(7, [protocol.SampledToken("r" * 300_000, 5)]))
    small = protocol.encode(protocol.Shutdown())
    stream = struct.pack("!i", len(big)) + big + struct.pack("!i", len(small)) + small
    for cut in (1, 3, 4096, len(stream)):
        assert frames_of(stream, cut) == [big, small]


def test_the_long_length_header_is_read() -> None:
    payload = protocol.encode(protocol.Shutdown())
    stream = struct.pack("!iQ", -1, len(payload)) + payload
    assert frames_of(stream, 5) == [payload]
