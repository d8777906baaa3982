"""A served text model whose workers are a FakePool recording each admission, for the
endpoints' lifecycle tests (the fixtures are conftest.py's)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from omni.modalities.outputs.router import OutputRouter
from scheduler.request import Request
from tests.omni.fake_pool import FakePool

REPLY = "Hello there"
USER_HI = {"role": "user", "content": "Hi"}


@dataclass
class AdmittingPool(FakePool):
    """FakePool, recording each admission: its requests, its deadline, and when it ended."""

    admissions: list[tuple[list[Request], float | None]] = field(default_factory=list)
    released: int = 0

    def admit(self, requests: Sequence[Request], timeout: float | None = None) -> AbstractContextManager[None]:
        self.admissions.append((list(requests), timeout))
        return _Admission(self)


@dataclass
class _Admission(AbstractContextManager[None]):
    pool: AdmittingPool

    def __exit__(self, *exc: object) -> None:
        self.pool.released += 1


async def run(outputs: Sequence[OutputRouter]) -> list[tuple[str, str | None]]:
    """Each choice's text and finish reason, run one after another."""
    out = []
    for output in outputs:
        text, finish = "", None
        async for delta in output.deltas():
            text += delta.text
            finish = delta.finish_reason or finish
        out.append((text, finish))
    return out
