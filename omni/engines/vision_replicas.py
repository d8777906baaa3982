"""VisionDecoderReplicas: --vision-decoder-replicas independent image decoder groups behind one
model, each a VisionDecoderEngine (its own processes, devices, queue and batches).

Placement: an image goes to the ready replica with the least work outstanding (DiT tokens x
steps of its queued and running images; the lower index among equals) that has room in its
queue; when none has room, the least loaded one refuses it (Overloaded, a 429). A seed draws
the same image on any replica: every replica loads the same weights, and a batch draws each of
its images as it would alone (gpu_workers/vision_decoder/decoder.py).

A replica that dies fails only the batch it was drawing, as one group does. Its queued images,
which had not started, move to the replicas still up (each placed as a new one would be); with
none up they wait for its restart. The supervisor restarts it while the others serve.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

from omni.config import VisionDecoderConfig
from omni.engines.supervisor import EngineError, SupervisedWorker
from omni.engines.vision_decoder import ImageRequest, PreviewCallback, VisionDecoderEngine, _Pending
from omni.metrics import Metrics
from omni.shared import protocol


class VisionDecoderReplicas:
    def __init__(
        self,
        specs: Sequence[protocol.VisionDecoderWorkerSpec],
        metrics: Metrics,
        model_name: str,
        config: VisionDecoderConfig | None = None,
        *,
        start_timeout: float = 600.0,
    ) -> None:
        if not specs:
            raise ValueError("an image decoder needs at least one replica")
        self.replicas = [
            VisionDecoderEngine(spec, metrics, model_name, config, start_timeout=start_timeout) for spec in specs
        ]
        job_ids = itertools.count(1)  # one numbering: a lost replica's images join another's batches
        for engine in self.replicas:
            engine.job_ids = job_ids
            engine.on_lost = functools.partial(self._re_place, engine)

    @property
    def workers(self) -> tuple[SupervisedWorker, ...]:
        return tuple(self.replicas)

    @property
    def ready(self) -> bool:
        """Images can be drawn: at least one replica is up."""
        return any(engine.ready for engine in self.replicas)

    @property
    def info(self) -> protocol.VisionDecoderReady | None:
        return next((e.info for e in self.replicas if e.ready), self.replicas[0].info)

    @property
    def queue_length(self) -> int:
        return sum(engine.queue_length for engine in self.replicas)

    def _pick(self, exclude: VisionDecoderEngine | None = None) -> VisionDecoderEngine | None:
        up = [e for e in self.replicas if e.ready and e is not exclude]
        if not up:
            return None
        return min(up, key=lambda e: (not e.has_room, e.outstanding_work, e.replica))

    async def draw(self, image: ImageRequest, on_preview: PreviewCallback | None = None) -> protocol.DecodedImage:
        """VisionDecoderEngine.draw on the least loaded ready replica (its errors, its
        Overloaded when no replica has room)."""
        engine = self._pick()
        if engine is None:
            raise EngineError("the vision decoder is not ready")
        return await engine.draw(image, on_preview)

    def _re_place(self, source: VisionDecoderEngine, lost: list[_Pending]) -> list[_Pending]:
        """`source` died with these images queued: each goes to the least loaded replica still
        up (over its queue bound if need be: they were admitted); those with nowhere to go are
        handed back to wait for the restart."""
        kept: list[_Pending] = []
        for pending in sorted(lost, key=lambda p: p.order):
            if pending.future.done():
                continue
            target = self._pick(exclude=source)
            if target is None:
                kept.append(pending)
            else:
                target.adopt([pending])
        return kept
