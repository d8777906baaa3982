"""ResponseStore: a record lives its time and no longer (a fake clock), the bounds drop the
oldest first, and background runs are cancelled by cancel, delete and close."""

from __future__ import annotations

import asyncio

import orjson

from omni.serving.responses.store import ResponseStore


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


async def test_records_are_written_through_and_read_by_another_process(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Another process (a restarted server, or another node on a shared store) reads a record
    from the artifact store, until its wall-clock expiry; every drop deletes the store's copy."""
    from omni.shared.store.local import LocalStore

    artifacts = LocalStore(tmp_path, "http://x", b"secret")
    wall = Clock()
    writer = ResponseStore(ttl_s=60, clock=Clock(), artifacts=artifacts, wall_clock=wall)
    writer.put("resp_1", *_record(1))
    writer.put("resp_2", *_record(2))
    await writer.close()  # the writes land
    assert await artifacts.exists("resp/resp_1.json") and await artifacts.exists("resp/resp_2.json")

    reader = ResponseStore(ttl_s=60, clock=Clock(), artifacts=artifacts, wall_clock=wall)
    found = await reader.fetch("resp_1")
    assert found is not None and found.response == _record(1)[0] and found.messages == _record(1)[1]
    assert await reader.fetch("resp_9") is None and await reader.fetch("../etc/passwd") is None
    assert await reader.remove("resp_2")  # only the store held it here
    await reader.close()
    assert not await artifacts.exists("resp/resp_2.json") and not await reader.remove("resp_2")

    wall.now += 61  # past its time: not served, and the first reader to find it frees it
    assert await reader.fetch("resp_1") is None
    await reader.close()
    assert not await artifacts.exists("resp/resp_1.json")


async def test_a_record_this_process_drops_leaves_the_store_too(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from omni.shared.store.local import LocalStore

    artifacts = LocalStore(tmp_path, "http://x", b"secret")
    clock = Clock()
    store = ResponseStore(ttl_s=60, max_entries=1, clock=clock, artifacts=artifacts, wall_clock=clock)
    store.put("resp_1", *_record(1))

    async def written() -> None:
        while not await artifacts.exists("resp/resp_1.json"):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(written(), 120)  # its copy is in the store (a hang guard, not a timing)
    store.put("resp_2", *_record(2))  # pushes resp_1 out
    clock.now += 61
    store.sweep()  # resp_2 expires
    await store.close()
    assert not await artifacts.exists("resp/resp_1.json") and not await artifacts.exists("resp/resp_2.json")


async def test_a_deleted_record_is_not_read_back_from_the_store_before_its_delete_lands(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Read-after-delete in one process: the store's copy is still being written or deleted when
    the next request comes; fetch waits for this process's own pending write or delete first."""
    from omni.shared.store.local import LocalStore

    store = ResponseStore(ttl_s=60, artifacts=LocalStore(tmp_path, "http://x", b"secret"))
    for _ in range(20):  # no sleeps: the write and the delete are still queued each time
        store.put("resp_1", *_record(1))
        assert store.delete("resp_1")
        assert await store.fetch("resp_1") is None
    await store.close()
