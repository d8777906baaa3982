"""The runner registry: each spec type has exactly one runner class, the built-in ones are found
the first time a spec type is looked up, and a spec type without one is refused by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from gpu_workers import runner as registry
from gpu_workers.distributed import GroupMember
from gpu_workers.runner import Runner, register_runner, runner_class
from omni.shared import protocol


@pytest.fixture
def runners(monkeypatch: pytest.MonkeyPatch) -> dict[Any, Any]:
    """The registry's table, restored after the test."""
    table = dict(registry._RUNNERS)
    monkeypatch.setattr(registry, "_RUNNERS", table)
    return table


BUILT_IN = (
    protocol.LLMWorkerSpec, protocol.EncoderWorkerSpec, protocol.VisionDecoderWorkerSpec,
    protocol.AudioDecoderWorkerSpec,
)  # fmt: skip


def test_each_built_in_kind_finds_its_runner() -> None:
    found = {spec.__name__: runner_class(spec).__name__ for spec in BUILT_IN}
    assert found == {
        "LLMWorkerSpec": "LLMRunner",
        "EncoderWorkerSpec": "EncoderRunner",
        "VisionDecoderWorkerSpec": "VisionDecoderRunner",
        "AudioDecoderWorkerSpec": "AudioDecoderRunner",
    }
    # the built-in kinds' runners are exactly the modules the registry imports (another test file
    # in the same process may have registered a runner of its own: tests/omni/group_runner.py)
    assert {runner_class(spec).__module__ for spec in BUILT_IN} == set(registry._BUILTIN_RUNNER_MODULES)


@dataclass(frozen=True, slots=True, kw_only=True)
class _ToySpec(protocol.WorkerSpec):
    pass


class _ToyRunner(Runner):
    SPEC = _ToySpec
    JOB = int

    @classmethod
    def from_spec(cls, spec: Any, group: GroupMember) -> Runner:
        return cls()

    def ready_message(self, spec: Any) -> Any:
        return "ready"

    def run(self, job: Any) -> Any:
        return job + 1


def test_a_new_kind_is_a_registered_class(runners: dict[Any, Any]) -> None:
    with pytest.raises(ValueError, match="^no runner is registered for _ToySpec$"):
        runner_class(_ToySpec)
    assert register_runner(_ToyRunner) is _ToyRunner
    assert register_runner(_ToyRunner) is _ToyRunner  # registering the same class again is no change
    assert runner_class(_ToySpec) is _ToyRunner
    toy = _ToyRunner()
    assert toy.run(41) == 42
    assert (toy.profile(), toy.close()) == (None, None)  # nothing to profile or release by default
    with pytest.raises(NotImplementedError, match="_ToyRunner does not run as a process group"):
        toy.follow()


def test_a_spec_type_has_one_runner(runners: dict[Any, Any]) -> None:
    runner_class(protocol.LLMWorkerSpec)
    other = type("OtherLLMRunner", (_ToyRunner,), {"SPEC": protocol.LLMWorkerSpec})
    with pytest.raises(ValueError, match="^LLMWorkerSpec already has a runner: LLMRunner$"):
        register_runner(other)
