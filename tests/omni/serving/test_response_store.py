"""ResponseStore: a record lives its time and no longer (a fake clock), the bounds drop the
oldest first, and background runs are cancelled by cancel, delete and close."""

from __future__ import annotations

import asyncio

import orjson

from omni.serving.response_store import ResponseStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(i: int) -> tuple[dict[str, object], list[dict[str, object]]]:
    return {"id": f"resp_{i}", "status": "completed"}, [{"role": "user", "content": f"turn {i}"}]


def test_a_record_is_freed_after_its_time() -> None:
    clock = Clock()
    store = ResponseStore(ttl_s=60, clock=clock)
    store.put("resp_1", *_record(1))
    clock.now += 30
    store.put("resp_2", *_record(2))
    assert store.get("resp_1") is not None and len(store) == 2
    clock.now += 30  # resp_1's 60 s are up, resp_2 has 30 left
    assert store.get("resp_1") is None
    assert store.get("resp_2") is not None and len(store) == 1
    size = len(orjson.dumps(_record(2)[0])) + len(orjson.dumps(_record(2)[1]))
    assert store.num_bytes == size  # nothing of resp_1 is counted any more
    clock.now += 30
    assert len(store) == 0 and store.num_bytes == 0


def test_an_update_keeps_the_first_expiry() -> None:
    clock = Clock()
    store = ResponseStore(ttl_s=10, clock=clock)
    store.put("resp_1", *_record(1))
    clock.now += 9
    store.put("resp_1", {"id": "resp_1", "status": "cancelled"}, [])
    record = store.get("resp_1")
    assert record is not None and record.response["status"] == "cancelled"
    clock.now += 1
    assert store.get("resp_1") is None and store.num_bytes == 0


def test_the_bounds_drop_the_oldest_first() -> None:
    store = ResponseStore(max_entries=2)
    for i in range(3):
        store.put(f"resp_{i}", *_record(i))
    assert [store.get(f"resp_{i}") is not None for i in range(3)] == [False, True, True]
    one = len(orjson.dumps(_record(0)[0])) + len(orjson.dumps(_record(0)[1]))
    small = ResponseStore(max_bytes=2 * one)
    for i in range(3):
        small.put(f"resp_{i}", *_record(i))
    assert [small.get(f"resp_{i}") is not None for i in range(3)] == [False, True, True]
    assert small.num_bytes == 2 * one


def test_delete_says_whether_there_was_one() -> None:
    store = ResponseStore()
    store.put("resp_1", *_record(1))
    assert store.delete("resp_1") and not store.delete("resp_1") and store.get("resp_1") is None


async def test_background_runs_are_cancelled_by_cancel_delete_and_close() -> None:
    store = ResponseStore()
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(3600)

    for name in ("a", "b", "c"):
        store.put(name, {"id": name}, [])
        store.run_in_background(name, forever())
    await started.wait()
    assert store.cancel("a") and not store.cancel("a")
    assert store.delete("b") and store.get("b") is None
    await store.close()
    assert not store.cancel("c")


async def test_a_finished_run_cannot_be_cancelled() -> None:
    store = ResponseStore()

    async def quick() -> None:
        return None

    store.run_in_background("a", quick())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not store.cancel("a")
