"""A stage rebound to another runtime closes what it made on the old one (its database thread, its clients),
and keeps what it made when the runtime is the same."""

from __future__ import annotations

import asyncio
from pathlib import Path

from addons.context import Context
from addons.guard import Guard
from proxy.app import runtime
from proxy.journal import close_all


async def test_context_closes_the_old_runtimes_roads_and_keeps_them_for_the_same_runtime(tmp_path: Path) -> None:
    first = runtime.build(state_dir=str(tmp_path / "a"))
    runtime.install(first)
    stage = Context()
    try:
        roads = stage.roads()
        roads.store()  # the shared database thread of the first runtime
        worker = first.services.db
        assert worker is not None
        stage.bound(first)  # the same runtime again (an unrelated option changed)
        assert stage.roads() is roads and first.services.db is worker
        second = runtime.build(state_dir=str(tmp_path / "b"))
        runtime.install(second)
        assert stage.rt is second
        assert first.services.db is None and worker._closed  # the old thread closed, not left behind
        assert stage.roads() is not roads and stage.roads().rt is second
    finally:
        close_all()
        runtime.uninstall()


async def test_guard_lets_the_old_relay_finish_and_close(tmp_path: Path) -> None:
    runtime.install(runtime.build(state_dir=str(tmp_path / "a")))
    guard = Guard()
    try:
        closed = asyncio.Event()

        class Relay:
            async def close(self) -> None:
                closed.set()

        guard._relay = Relay()  # type: ignore[assignment]
        runtime.install(runtime.build(state_dir=str(tmp_path / "b")))
        assert guard.rt is not None  # rebinds to the new runtime
        await asyncio.wait_for(closed.wait(), 30)
        assert guard._relay is None
    finally:
        close_all()
        runtime.uninstall()
