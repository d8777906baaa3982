"""The scheduler's waiting queue, one class per --scheduling-policy (vLLM's names).

fcfs: arrival order; a preempted request goes back to the front (it arrived before anyone
still waiting). priority: ordered by urgency, (priority, arrival_time), lower first; a
preempted request goes back to its place in that order. Equal keys keep insertion order.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator
from typing import ClassVar, Literal

from scheduler.request import Request

SchedulingPolicy = Literal["fcfs", "priority"]


def urgency(request: Request) -> tuple[int, float]:
    """The priority policy's order: lower is served first, ties by arrival."""
    return request.priority, request.arrival_time


class WaitingQueue:
    POLICY: ClassVar[SchedulingPolicy]

    def add(self, request: Request) -> None:
        raise NotImplementedError

    def add_preempted(self, request: Request) -> None:
        raise NotImplementedError

    def peek(self) -> Request:
        raise NotImplementedError

    def pop(self) -> Request:
        raise NotImplementedError

    def remove(self, request: Request) -> None:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Request]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def __bool__(self) -> bool:
        return len(self) > 0


class FcfsQueue(WaitingQueue):
    POLICY = "fcfs"

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def add_preempted(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        # By identity: Request is a dataclass, so == would compare every field.
        self._queue = deque(r for r in self._queue if r is not request)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)

    def __len__(self) -> int:
        return len(self._queue)


class PriorityQueue(WaitingQueue):
    POLICY = "priority"

    def __init__(self) -> None:
        self._queue: list[Request] = []  # most urgent first

    def add(self, request: Request) -> None:
        bisect.insort_right(self._queue, request, key=urgency)

    def add_preempted(self, request: Request) -> None:
        self.add(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.pop(0)

    def remove(self, request: Request) -> None:
        self._queue = [r for r in self._queue if r is not request]

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)

    def __len__(self) -> int:
        return len(self._queue)


QUEUES: dict[SchedulingPolicy, type[WaitingQueue]] = {q.POLICY: q for q in (FcfsQueue, PriorityQueue)}
