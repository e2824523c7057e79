"""Commit: atomic per path, honest partial reports, permissions kept, cancellation, serialized writers."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from tests.patch_conformance.harness import snapshot
from tests.support.toolserver import make_services
from tools_server.patch import PatchFamily
from tools_server.patch.commit import LocalFs
from tools_server.patch.engine import default_file_mode
from tools_server.pathqueue import shared_path_queue
from tools_server.registry import CallContext, Services, ToolResult


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("alpha\nbeta\n")
    (root / "sub").mkdir()
    (root / "sub" / "b.txt").write_text("one\ntwo\n")
    return root


@pytest.fixture
def services(ws: Path) -> Services:
    return make_services(ws.parent / "svc", {"apply_patch.enabled": True}, ws)


async def call(services: Services, patch: str, fs: LocalFs | None = None,
               ctx: CallContext | None = None) -> ToolResult:
    family = PatchFamily(services, fs) if fs is not None else PatchFamily(services)
    return await family.tool.call({"patch": patch}, ctx or CallContext(services=services))


def wrap(body: str) -> str:
    return f"*** Begin Patch\n{body}\n*** End Patch\n"


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".ctp-patch")]


THREE_OPS = wrap(
    "*** Add File: new/x.txt\n+x\n"
    "*** Update File: a.txt\n@@\n-alpha\n+ALPHA\n"
    "*** Delete File: sub/b.txt"
)


class FailNthReplace(LocalFs):
    def __init__(self, n: int, effect: str = "none"):
        self.n, self.effect, self.calls = n, effect, 0

    def replace(self, src: str, dst: str) -> None:
        self.calls += 1
        if self.calls == self.n:
            if self.effect == "done":  # the rename happened, then an error was raised anyway
                os.replace(src, dst)
            elif self.effect == "garbage":
                Path(dst).write_bytes(b"half-written")
            raise OSError(5, "Input/output error")
        super().replace(src, dst)


async def test_partial_commit_report_names_each_operation(ws: Path, services: Services) -> None:
    result = await call(services, THREE_OPS, FailNthReplace(2))
    assert result.is_error
    assert [(o["op"], o["status"]) for o in result.details["operations"]] == [
        ("add", "committed"), ("update", "failed"), ("delete", "not_attempted")]
    assert result.details["error"] == "commit_failed"
    assert result.details["operations"][1]["error"] == "Input/output error (errno 5)"
    assert result.details["added"] == ["new/x.txt"] and result.details["modified"] == []
    assert result.details["created_dirs"] == ["new"]
    text = result.text
    assert text.startswith("apply_patch stopped while committing: updating 'a.txt' failed: Input/output error")
    assert "not a transaction" in text
    assert "Committed:\n  A new/x.txt" in text
    assert "Failed (left as it was):\n  M a.txt" in text
    assert "Not attempted (left as they were):\n  D sub/b.txt" in text
    # Nothing rolled back, nothing retried, nothing staged left behind.
    assert (ws / "new" / "x.txt").read_text() == "x\n"
    assert (ws / "a.txt").read_text() == "alpha\nbeta\n"
    assert (ws / "sub" / "b.txt").exists()
    assert leftovers(ws) == []


async def test_a_failed_step_whose_effect_landed_is_reported_as_committed(services: Services, ws: Path) -> None:
    result = await call(services, THREE_OPS, FailNthReplace(2, effect="done"))
    assert [o["status"] for o in result.details["operations"]] == ["committed", "committed", "not_attempted"]
    assert (ws / "a.txt").read_text() == "ALPHA\nbeta\n"


async def test_an_unrecognisable_outcome_is_unknown(services: Services, ws: Path) -> None:
    result = await call(services, THREE_OPS, FailNthReplace(2, effect="garbage"))
    assert [o["status"] for o in result.details["operations"]] == ["committed", "unknown", "not_attempted"]
    assert "Outcome unknown (check these files):\n  M a.txt" in result.text


async def test_a_move_whose_source_cannot_be_removed_is_partial(services: Services, ws: Path) -> None:
    class FailUnlink(LocalFs):
        def unlink(self, path: str) -> None:
            raise PermissionError(13, "Permission denied")

    result = await call(services, wrap("*** Update File: a.txt\n*** Move to: moved/a.txt\n@@\n-alpha\n+A"),
                        FailUnlink())
    assert [o["status"] for o in result.details["operations"]] == ["partial"]
    assert (ws / "moved" / "a.txt").read_text() == "A\nbeta\n"
    assert (ws / "a.txt").read_text() == "alpha\nbeta\n"
    assert "Partly done (destination written, source not removed):\n  M moved/a.txt (moved from a.txt)" in result.text


async def test_a_file_changed_after_preflight_is_not_overwritten(services: Services, ws: Path) -> None:
    class Meddler(LocalFs):
        def write_temp(self, directory: str, name: str, data: bytes, mode: int) -> str:
            (ws / "a.txt").write_text("someone else's edit\n")
            return super().write_temp(directory, name, data, mode)

    result = await call(services, wrap("*** Update File: a.txt\n@@\n-alpha\n+A"), Meddler())
    assert result.details["operations"][0]["status"] == "failed"
    assert "changed on disk" in result.text
    assert (ws / "a.txt").read_text() == "someone else's edit\n"


async def test_executable_bit_and_permissions_are_kept(services: Services, ws: Path) -> None:
    script = ws / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o750)
    tool = ws / "tool.sh"
    tool.write_text("old\n")
    tool.chmod(0o755)
    result = await call(services, wrap(
        "*** Update File: run.sh\n@@\n-echo hi\n+echo bye\n"
        "*** Add File: tool.sh\n+new\n"
        "*** Update File: a.txt\n*** Move to: bin/a.txt\n@@\n-alpha\n+A\n"
        "*** Add File: plain.txt\n+p"
    ))
    assert not result.is_error, result.text
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755  # overwriting keeps the file's permissions
    assert stat.S_IMODE((ws / "plain.txt").stat().st_mode) == default_file_mode()
    assert (ws / "bin" / "a.txt").read_text() == "A\nbeta\n"


async def test_moved_executable_stays_executable(services: Services, ws: Path) -> None:
    (ws / "a.txt").chmod(0o755)
    result = await call(services, wrap("*** Update File: a.txt\n*** Move to: b.sh\n@@\n-alpha\n+A"))
    assert not result.is_error
    assert stat.S_IMODE((ws / "b.sh").stat().st_mode) == 0o755 and not (ws / "a.txt").exists()


async def test_each_path_is_replaced_atomically(services: Services, ws: Path) -> None:
    inode = (ws / "a.txt").stat().st_ino
    assert not (await call(services, wrap("*** Update File: a.txt\n@@\n-alpha\n+A"))).is_error
    assert (ws / "a.txt").stat().st_ino != inode  # a new file renamed over the old one
    assert leftovers(ws) == []


async def test_an_update_that_changes_nothing_writes_nothing(services: Services, ws: Path) -> None:
    inode = (ws / "a.txt").stat().st_ino
    result = await call(services, wrap("*** Update File: a.txt\n@@\n-alpha\n+alpha"))
    assert result.text == "Success. Updated the following files:\nM a.txt"
    assert (ws / "a.txt").stat().st_ino == inode


async def test_cancelled_before_start(services: Services, ws: Path) -> None:
    ctx = CallContext(services=services)
    ctx.cancel.set()
    before = snapshot(ws)
    result = await call(services, THREE_OPS, ctx=ctx)
    assert result.is_error and result.details["error"] == "cancelled"
    assert snapshot(ws) == before


async def test_cancelled_after_staging_discards_everything(services: Services, ws: Path) -> None:
    ctx = CallContext(services=services)
    loop = asyncio.get_running_loop()

    class CancelWhileStaging(LocalFs):
        def write_temp(self, directory: str, name: str, data: bytes, mode: int) -> str:
            loop.call_soon_threadsafe(ctx.cancel.set)
            time.sleep(0.05)  # let the loop run the callback before the last check
            return super().write_temp(directory, name, data, mode)

    before = snapshot(ws)
    result = await call(services, THREE_OPS, CancelWhileStaging(), ctx=ctx)
    assert result.is_error and result.details["error"] == "cancelled"
    assert "before any file changed" in result.text
    assert snapshot(ws) == before and leftovers(ws) == [] and not (ws / "new").exists()


async def test_task_cancelled_during_commit_finishes_the_commit_before_releasing_paths(
    services: Services, ws: Path
) -> None:
    entered, release = threading.Event(), threading.Event()

    class SlowReplace(LocalFs):
        def replace(self, src: str, dst: str) -> None:
            entered.set()
            release.wait(10)
            super().replace(src, dst)

    task = asyncio.ensure_future(call(services, wrap("*** Update File: a.txt\n@@\n-alpha\n+A"), SlowReplace()))
    await asyncio.to_thread(entered.wait, 10)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # still waiting for the commit thread
    assert shared_path_queue(services).busy_paths() == [str(ws / "a.txt")]
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (ws / "a.txt").read_text() == "A\nbeta\n"
    assert shared_path_queue(services).busy_paths() == []


async def test_concurrent_patches_on_one_file_serialize(services: Services, ws: Path) -> None:
    class SlowStage(LocalFs):
        def write_temp(self, directory: str, name: str, data: bytes, mode: int) -> str:
            time.sleep(0.1)  # widen the window in which unserialized writers would interleave
            return super().write_temp(directory, name, data, mode)

    fs = SlowStage()
    first = call(services, wrap("*** Update File: a.txt\n@@\n-alpha\n+ALPHA\n beta"), fs)
    second = call(services, wrap("*** Update File: a.txt\n@@\n alpha\n-beta\n+BETA"), fs)
    r1, r2 = await asyncio.gather(first, second)
    # The second patch waits for the first and then sees its result, so its context no longer matches.
    assert not r1.is_error
    assert r2.is_error and "Failed to find expected lines" in r2.text
    assert (ws / "a.txt").read_text() == "ALPHA\nbeta\n"

    third = call(services, wrap("*** Update File: a.txt\n@@\n-ALPHA\n+1"), fs)
    fourth = call(services, wrap("*** Update File: a.txt\n@@\n-beta\n+2"), fs)
    r3, r4 = await asyncio.gather(third, fourth)
    assert not r3.is_error and not r4.is_error, (r3.text, r4.text)
    assert (ws / "a.txt").read_text() == "1\n2\n"
