"""ModelPool: the data-parallel LLM workers of one model and the placement between them."""

from __future__ import annotations

import asyncio
import logging

from omni.config import EngineConfig
from omni.constrained.constraint import TokenConstraint
from omni.engine import EngineError, LLMEngine, RequestStream
from omni.metrics import Metrics
from scheduler.placement import Placement, make_placement
from scheduler.prefix_hash import block_hashes
from scheduler.request import Request, RequestStatus

log = logging.getLogger("omni.model_pool")


class ModelPool:
    def __init__(
        self, config: EngineConfig, metrics: Metrics, placement: Placement | None = None
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.placement = placement or make_placement(
            config.placement, dict(config.placement_weights) or None
        )
        devices = config.devices or (config.device,)
        self.engines = [
            LLMEngine(config, metrics, worker_id=i, device=devices[i % len(devices)])
            for i in range(config.num_workers)
        ]

    @property
    def name(self) -> str:
        return self.config.model_name

    @property
    def ready(self) -> bool:
        """Every worker is up (what /health reports)."""
        return all(e.ready for e in self.engines)

    @property
    def serving(self) -> bool:
        """At least one worker can take requests."""
        return any(e.ready for e in self.engines)

    @property
    def max_model_len(self) -> int:
        lens = [e.max_model_len for e in self.engines if e.max_model_len]
        return min(lens) if lens else 0

    async def start(self) -> None:
        await asyncio.gather(*(e.start() for e in self.engines))

    async def stop(self) -> None:
        await asyncio.gather(*(e.stop() for e in self.engines), return_exceptions=True)

    def submit(self, request: Request, constraint: TokenConstraint | None = None) -> RequestStream:
        live = [e for e in self.engines if e.ready]
        if not live:
            raise EngineError("no worker of this model is ready")
        if len(self.engines) == 1:  # nothing to choose: skip hashing the prompt here
            self.metrics.add_placement(self.name, str(live[0].worker_id), "only")
            return live[0].submit(request, constraint=constraint)
        # One hash chain serves every worker: they share the block size. Full blocks only.
        hashes = block_hashes(
            request.prompt_token_ids, self.config.block_size, media=request.media
        )
        decision = self.placement.choose(
            [e.placement_state(hashes) for e in live], len(hashes)
        )
        engine = self.engines[decision.worker_id]
        self.metrics.add_placement(self.name, str(decision.worker_id), decision.reason)
        return engine.submit(request, hashes, constraint)

    def abort(
        self, stream: RequestStream, status: RequestStatus = RequestStatus.FINISHED_ABORTED
    ) -> None:
        self.engines[stream.worker_id].abort(stream.request.request_id, status)
