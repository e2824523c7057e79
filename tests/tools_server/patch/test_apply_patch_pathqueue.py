"""The per-path mutation queue shared by file-writing tools."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.toolserver import make_services
from tools_server.pathqueue import PathQueue, QueueWaitCancelled, shared_path_queue


async def test_same_path_runs_in_arrival_order_and_disjoint_paths_overlap() -> None:
    queue = PathQueue()
    log: list[str] = []
    gate = asyncio.Event()

    async def writer(name: str, paths: list[str], wait: bool = False) -> None:
        async with queue.hold(paths):
            log.append(f"{name}+")
            if wait:
                await gate.wait()
            log.append(f"{name}-")

    first = asyncio.create_task(writer("a", ["/w/x"], wait=True))
    await asyncio.sleep(0)
    second = asyncio.create_task(writer("b", ["/w/./x"]))  # the same path, spelled differently
    third = asyncio.create_task(writer("c", ["/w/y"]))
    await asyncio.sleep(0.01)
    assert log == ["a+", "c+", "c-"]  # b waits for a; c does not
    gate.set()
    await asyncio.gather(first, second, third)
    assert log == ["a+", "c+", "c-", "a-", "b+", "b-"]
    assert queue.busy_paths() == []


async def test_overlapping_sets_do_not_deadlock() -> None:
    queue = PathQueue()
    done: list[int] = []

    async def writer(i: int, paths: list[str]) -> None:
        async with queue.hold(paths):
            await asyncio.sleep(0.001)
            done.append(i)

    await asyncio.wait_for(
        asyncio.gather(*(writer(i, ["/p", "/q"] if i % 2 else ["/q", "/p"]) for i in range(20))), 5
    )
    assert sorted(done) == list(range(20))


async def test_cancel_while_waiting_gives_up_without_running() -> None:
    queue = PathQueue()
    cancel = asyncio.Event()
    ran = False
    release = asyncio.Event()

    async def holder() -> None:
        async with queue.hold(["/a"]):
            await release.wait()

    async def waiter() -> None:
        nonlocal ran
        async with queue.hold(["/b", "/a"], cancel=cancel):
            ran = True

    h = asyncio.create_task(holder())
    await asyncio.sleep(0)
    w = asyncio.create_task(waiter())
    await asyncio.sleep(0.01)
    assert queue.busy_paths() == ["/a", "/b"]
    cancel.set()
    with pytest.raises(QueueWaitCancelled):
        await w
    assert not ran
    assert queue.busy_paths() == ["/a"]  # "/b" was released when the waiter gave up
    release.set()
    await h
    async with queue.hold(["/a", "/b"]):  # nothing left locked
        pass
    assert queue.busy_paths() == []


async def test_task_cancellation_while_waiting_releases_held_paths() -> None:
    queue = PathQueue()
    release = asyncio.Event()

    async def holder() -> None:
        async with queue.hold(["/a"]):
            await release.wait()

    h = asyncio.create_task(holder())
    await asyncio.sleep(0)
    w = asyncio.create_task(queue.hold(["/0", "/a"], cancel=asyncio.Event()).__aenter__())
    await asyncio.sleep(0.01)
    w.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w
    release.set()
    await h
    assert queue.busy_paths() == []


def test_one_queue_per_tool_server(tmp_path: Path) -> None:
    services = make_services(tmp_path)
    assert shared_path_queue(services) is shared_path_queue(services)
    assert shared_path_queue(make_services(tmp_path / "other")) is not shared_path_queue(services)
