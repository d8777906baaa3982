"""The runner interface and registry: one runner class per worker kind, chosen by spec type.

A worker process (gpu_workers/worker.py) decodes its spec, looks up the runner class
registered for that spec's type, builds it, sends the runner's ready message, and hands it
every job message of its JOB type. A new worker kind is a spec (omni/shared/protocol/specs.py) and a
runner class decorated with @register_runner, not a branch anywhere.

A kind whose spec asks for world_size > 1 runs as a torch.distributed group: every rank
builds the runner with its GroupMember; rank 0 is served jobs from the pipe, and the other
ranks call follow(), where the runner takes part in rank 0's collectives.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from gpu_workers.distributed import GroupMember
from omni.shared.protocol import WorkerSpec

# Where the built-in runners are defined: imported in the worker process only (they import
# torch), the first time a runner is looked up.
_BUILTIN_RUNNER_MODULES = (
    "gpu_workers.llm.runner",
    "gpu_workers.encoder.runner",
    "gpu_workers.vision_decoder.runner",
    "gpu_workers.audio_decoder.runner",
)


class Runner(ABC):
    SPEC: ClassVar[type[WorkerSpec]]  # the spec type this runner serves
    JOB: ClassVar[type | tuple[type, ...]]  # the message type(s) it executes (a Step, an EncodeBatch, ...)
    # The next message on the worker's pipe, for a job that reads one of its own before it ends
    # (a Step's grammar masks, filled while its forward runs); the worker sets it before the
    # first job. A job must read exactly the messages that belong to it, failed or not.
    receive: Callable[[], Any] | None = None

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: Any, group: GroupMember) -> Runner:
        """Load the weights the spec names (in this process, on the spec's device)."""

    @abstractmethod
    def ready_message(self, spec: Any) -> Any:
        """The kind's ready message (spec.READY), sent once the runner is loaded."""

    @abstractmethod
    def run(self, job: Any) -> Any:
        """Execute one job message; return its result message, or an iterator of messages
        (progress first, the result last) sent one by one as they are yielded. An exception
        fails only this job: the server fails its requests and keeps the worker."""

    def follow(self) -> None:
        """Ranks > 0 of a group: take part in rank 0's jobs until the group ends."""
        raise NotImplementedError(f"{type(self).__name__} does not run as a process group")

    def profile(self) -> None:
        """Run the largest job this worker may be given, once, before it says ready: on a GPU
        the caching allocator then holds that peak for it, and the LLM workers that size their
        KV caches after it see it as used (gpu_workers/llm/memory.py, review A7). Default: nothing."""

    def close(self) -> None:
        """Release what the runner holds (threads, store connections) before the process exits."""


R = TypeVar("R", bound=type[Runner])
_RUNNERS: dict[type[WorkerSpec], type[Runner]] = {}


def register_runner(cls: R) -> R:
    owner = _RUNNERS.get(cls.SPEC)
    if owner is not None and owner is not cls:
        raise ValueError(f"{cls.SPEC.__name__} already has a runner: {owner.__name__}")
    _RUNNERS[cls.SPEC] = cls
    return cls


def runner_class(spec_type: type[WorkerSpec]) -> type[Runner]:
    if spec_type not in _RUNNERS:
        for module in _BUILTIN_RUNNER_MODULES:
            importlib.import_module(module)
    try:
        return _RUNNERS[spec_type]
    except KeyError:
        raise ValueError(f"no runner is registered for {spec_type.__name__}") from None
