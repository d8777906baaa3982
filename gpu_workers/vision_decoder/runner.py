"""VisionDecoderRunner: the image decoder's worker kind, one process per rank of its group.

Rank 0 is served DecodeImages batches from the pipe. It hands each batch to the other ranks
first, as the protocol's own bytes broadcast over the group's hand-off group (gloo, CPU
tensors, no timeout to speak of: gpu_workers/distributed.py; nothing pickled):

    rank 0    encode(batch) -> n bytes    broadcast [n] (int64)    broadcast bytes (uint8, n)
    rank > 0  (in follow())               receive n                receive, decode(bytes)

A follower waits for its next batch there, however long the server idles; the collective
group (NCCL on GPUs), whose waits time out, carries only the work inside a batch.

then every rank runs the same VisionDecoder.generate on it, which shards the tokens over the
group (Ulysses), or, with the spec's guidance_parallel, runs one of a step's two guided
passes over its half of the group (guidance_parallel.py). Rank 0 streams PartialImage
messages as the previews are made and the DecodeResult last. A batch whose jobs do not
share a shape fails on rank 0 before it is broadcast, so the others never see it; a job's own
error (its codes, its size) is a DecodedImage.error and every rank skips that job alike.

Any other error inside a batch (out of memory on one device, a bug) may leave the ranks at
different collectives, and the next batch's broadcast would then pair with a stale all-to-all.
So in a group such an error ends the rank's process: the server sees a rank exit, fails the
batch in flight and starts the group again (a worker of one rank just reports it and goes on).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from gpu_workers.distributed import GroupMember
from gpu_workers.runner import Runner, register_runner
from gpu_workers.vision_decoder.decoder import Generation, Preview, VisionDecoder
from gpu_workers.vision_decoder.guidance_parallel import GuidanceGroups
from omni.shared import protocol
from omni.shared.media.image_sizes import RATIO_SIZES

log = logging.getLogger("omni.vision_decoder")

SIZES = [f"{width}x{height}" for width, height in RATIO_SIZES.values()]


@register_runner
class VisionDecoderRunner(Runner):
    SPEC = protocol.VisionDecoderWorkerSpec
    JOB = protocol.DecodeImages

    def __init__(self, decoder: VisionDecoder, member: GroupMember, max_batch: tuple[int, int] = (8, 32768)) -> None:
        self.decoder = decoder
        self.member = member
        self.max_batch_images, self.max_batch_tokens = max_batch

    @classmethod
    def from_spec(cls, spec: protocol.VisionDecoderWorkerSpec, group: GroupMember) -> VisionDecoderRunner:
        device = torch.device(spec.device_of(group.rank))
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's collectives run on the current device
        groups = GuidanceGroups.split(group.rank, group.world_size) if spec.guidance_parallel else None
        decoder = VisionDecoder.from_dir(
            Path(spec.model_dir),
            device=device,
            dtype=getattr(torch, spec.dtype),
            vae_dtype=getattr(torch, spec.vae_dtype),
            guidance_groups=groups,
            compile_dit=spec.compile_dit,
        )
        return cls(decoder, group, (spec.max_batch_images, spec.max_batch_tokens))

    def largest_batch(self) -> list[protocol.ImageJob]:
        """The engine's largest batch: its largest size, as many as its bounds allow, one step."""
        width, height = max(RATIO_SIZES.values(), key=lambda wh: wh[0] * wh[1])
        tokens = (width // 16) * (height // 16)  # the engine's count (omni/engines/vision_decoder.py)
        count = min(self.max_batch_images, max(1, self.max_batch_tokens // tokens))
        codes = [0] * self.decoder.config.num_codes_per_image
        return [protocol.ImageJob(i, codes, width, height, 1, i) for i in range(count)]

    def profile(self) -> None:
        if self.member.world_size > 1:
            return  # a group's ranks would have to draw it together; their peak is the DiT's shard
        self.decoder.decode(self.largest_batch())

    def ready_message(self, spec: protocol.VisionDecoderWorkerSpec) -> protocol.VisionDecoderReady:
        config = self.decoder.config
        rows, cols = config.code_grid
        return protocol.VisionDecoderReady(
            spec.worker_id,
            spec.device,
            self.member.world_size,
            rows,
            cols,
            self.decoder.num_codes,
            config.guidance,
            config.guidance_scale,
            list(SIZES),
        )

    def run(self, batch: protocol.DecodeImages) -> Iterator[protocol.PartialImage | protocol.DecodeResult]:
        self.decoder.check_batch(batch.jobs)  # raises before the other ranks are involved
        self._broadcast(batch)
        try:
            for event in self.decoder.generate(batch.jobs):
                if isinstance(event, Preview):
                    yield protocol.PartialImage(batch.batch_id, event.job_id, event.index, event.data)
                else:
                    yield _result(batch.batch_id, event)
        except Exception:
            if self.member.world_size > 1:
                self._leave_group(batch)
            raise

    def follow(self) -> None:
        while True:
            try:
                batch = self._receive()
            except RuntimeError as exc:  # gloo / NCCL: rank 0 is gone, and with it the group
                log.info("rank %d: the group has ended (%s)", self.member.rank, exc)
                return
            try:
                self.decoder.decode(batch.jobs)
            except Exception:
                self._leave_group(batch)

    def close(self) -> None:
        self.decoder.close()

    def _leave_group(self, batch: protocol.DecodeImages) -> None:
        """The ranks may be out of step (see the module docstring): end this process, and with
        it the group, now. os._exit: a clean exit could wait forever on a collective."""
        log.exception("rank %d: batch %d failed; leaving the group", self.member.rank, batch.batch_id)
        logging.shutdown()
        os._exit(1)

    def _broadcast(self, batch: protocol.DecodeImages) -> None:
        if self.member.world_size == 1:
            return
        data = protocol.encode(batch)
        group = self.member.handoff  # gloo: the tensors stay on the CPU
        dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), src=0, group=group)
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=0, group=group)

    def _receive(self) -> protocol.DecodeImages:
        group = self.member.handoff
        size = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(size, src=0, group=group)  # the idle wait: blocks, no timeout, no spin
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(data, src=0, group=group)
        batch = protocol.decode(data.numpy().tobytes())
        if not isinstance(batch, protocol.DecodeImages):
            raise TypeError(f"rank 0 broadcast a {type(batch).__name__}, not DecodeImages")
        return batch


def _result(batch_id: int, generation: Generation) -> protocol.DecodeResult:
    return protocol.DecodeResult(batch_id, generation.images, generation.step_seconds, generation.vae_seconds)
