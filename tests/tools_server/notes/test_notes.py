"""Notes: paths, lines and pages, the store's cap/metadata/locks, and the five tools (Tool.call)."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from proxy.config import Config
from proxy.journal import Journal
from proxy.notes import NoteError, NotePathError, NotesStore, parse
from proxy.notes.lines import LineRangeError, select_lines, split_lines
from proxy.session import SessionIdentity
from proxy.state import StateDir
from tools_server.history.schemas import CODEX_TOOLS, runtime_parameters
from tools_server.notes import create_family
from tools_server.registry import CallContext, Services, ToolError


def test_paths():
    agents = {"/root", "/root/reviewer", "/root/notes"}
    is_agent = agents.__contains__
    assert parse("plan.md", "/root", is_agent).rel == "plan.md"
    ref = parse("/root/reviewer/notes/a/b.md", "/root", is_agent)
    assert (ref.address, ref.rel, ref.shown()) == ("/root/reviewer", "a/b.md", "/root/reviewer/notes/a/b.md")
    assert parse("/root/notes/x", "/root/reviewer", is_agent).address == "/root"  # first registered wins
    assert parse("/root/notes/notes/x", "/root/reviewer", lambda a: a == "/root/notes").rel == "x"
    assert parse("", "/root", is_agent, prefix=True).rel == ""
    assert parse("dir/", "/root", is_agent, prefix=True).rel == "dir/"
    for bad in ("", "a//b", "./a", "a/../b", "..", "a\\b", "/root/ghost/notes/x", "/root/reviewer/x",
                "/elsewhere/notes/x", "/root/reviewer/notes/"):
        with pytest.raises(NotePathError):
            parse(bad, "/root", is_agent)


def test_lines_and_ranges():
    text = "one\ntwo\nthree\n"
    assert split_lines(text) == ["one\n", "two\n", "three\n"] and split_lines("a\nb") == ["a\n", "b"]
    assert select_lines(text, None, None).text == text
    assert select_lines(text, 2, 2).text == "two\n"
    assert select_lines(text, -2, -1).text == "two\nthree\n"
    assert (select_lines(text, -10, 1).first, select_lines(text, -10, 1).last) == (1, 1)
    assert select_lines(text, 3, 2).text == "" and select_lines("", None, None).total == 0
    assert select_lines(text, 2, 99).text == "two\nthree\n"
    with pytest.raises(LineRangeError):
        select_lines(text, 0, 1)


def test_store_cap_is_exact_and_metadata_keeps_creation_time(tmp_path: Path):
    store = NotesStore(tmp_path / "notes", "task_x", max_bytes=100)
    assert store.write("/root", "a.md", "é" * 50).bytes == 100  # 100 UTF-8 bytes: exactly the cap
    with pytest.raises(NoteError, match="limit is 100"):
        store.append("/root", "a.md", "x")
    with pytest.raises(NoteError, match="0 left"):
        store.append("/root", "a.md", "x")
    store.write("/root", "b.md", "")
    assert store.read("/root", "b.md") == "" and store.append("/root", "b.md", "").bytes == 0
    created = {n.rel: n.created_at for n in store.iter_files("/root")}
    time.sleep(0.02)
    store.write("/root", "a.md", "new")
    again = {n.rel: n for n in store.iter_files("/root")}
    assert again["a.md"].created_at == created["a.md"] and again["a.md"].updated_at > created["a.md"]
    # Private files never show up among the notes.
    assert sorted(n.rel for n in store.iter_files("/root")) == ["a.md", "b.md"]
    assert (store.task_dir / ".ctp").is_dir()
    with pytest.raises(NoteError, match="does not exist"):
        store.read("/root", "missing.md")


def test_store_never_follows_links_and_reads_only_regular_files(tmp_path: Path):
    store = NotesStore(tmp_path / "notes", "task_x")
    store.write("/root", "real.md", "real\n")
    root = store.agent_dir("/root")
    os.symlink(root / "real.md", root / "inside-link.md")  # even a link inside the notes is not a note
    os.symlink("real.md", root / "relative-link.md")
    os.mkfifo(root / "pipe.md")  # a read must not block on it
    (root / "back\\slash.md").write_text("x")  # made outside the tools: they could not address it
    assert [n.rel for n in store.iter_files("/root")] == ["real.md"]
    for rel in ("inside-link.md", "relative-link.md"):
        with pytest.raises(NoteError, match="is a symbolic link"):
            store.read("/root", rel)
        with pytest.raises(NoteError, match="is a symbolic link"):
            store.append("/root", rel, "x")
    with pytest.raises(NoteError, match="not a regular file"):
        store.read("/root", "pipe.md")
    with pytest.raises(NoteError, match="special file"):
        store.append("/root", "pipe.md", "x")
    with pytest.raises(NoteError, match="is a file, not a directory"):
        store.write("/root", "real.md/sub.md", "x")
    assert store.read("/root", "real.md") == "real\n" and os.readlink(root / "inside-link.md") == str(root / "real.md")


def test_note_paths_are_bounded():
    ok = "/".join(["d"] * 31) + "/leaf.md"
    assert parse(ok, "/root", lambda a: False).rel == ok
    for bad in ("/".join(["d"] * 32) + "/leaf.md", "a/" * 600 + "b", "x" * 256, "y" * 3000,
                "/root/" + "a/" * 1500 + "notes/x", "bad\udc80.md"):
        with pytest.raises(NotePathError) as info:
            parse(bad, "/root", lambda a: False)
        assert len(str(info.value)) < 400


def _hold_lock(store_root: str, ready: multiprocessing.synchronize.Event) -> None:
    store = NotesStore(Path(store_root), "task_x")
    lock = store._lock("/root", "held.md")
    lock.acquire()
    ready.set()
    time.sleep(60)


def test_dead_holder_lock_is_recovered_and_live_lock_times_out(tmp_path: Path):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold_lock, args=(str(tmp_path / "notes"), ready))
    proc.start()
    assert ready.wait(30)
    store = NotesStore(tmp_path / "notes", "task_x", lock_timeout=0.3)
    with pytest.raises(NoteError, match="busy"):
        store.write("/root", "held.md", "x")
    os.kill(proc.pid, 9)
    proc.join(10)
    assert store.write("/root", "held.md", "after").bytes == 5


# ----------------------------------------------------------------------------------------------- tools

@pytest.fixture
def world(tmp_path: Path):
    state = StateDir.open(tmp_path / "state")
    j = Journal(state)
    key, task, addr = j.resolve(SessionIdentity("f:r", "fingerprint", None, None), {}, {})
    j.session(key, task, addr)
    ckey, _, caddr = j.resolve(SessionIdentity("t:c", "header", task, "reviewer"), {}, {})
    j.session(ckey, task, caddr)
    other = j.resolve(SessionIdentity("f:o", "fingerprint", None, None), {}, {})
    j.session(*other)
    assert j.flush()
    yield Services(Config(), state, tmp_path), task, other[1]
    j.close()


@pytest.fixture
async def tools(world):
    fam = create_family(world[0])
    yield {t.name: t for t in fam.tools()}
    await fam.close()


def cc(world, agent: str | None = None, task: str | None = None) -> CallContext:
    return CallContext(world[0], task=task or world[1], agent=agent)


def rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_notes_schemas():
    for name in ("notes_list_files_by_prefix", "notes_search_contents", "notes_append_to_file", "notes_write_file"):
        rt = runtime_parameters(name)
        frozen = CODEX_TOOLS[name][1]
        assert set(rt["properties"]) == set(frozen["properties"]) and rt.get("required") == frozen.get("required")
        assert all("encrypted" not in p for p in rt["properties"].values())
    read = runtime_parameters("notes_read_file")
    assert set(read["properties"]) == {"path", "start_line", "stop_line", "offset_chars", "limit_chars"}


async def test_write_read_append_and_lines(world, tools):
    w = tools["notes_write_file"].call
    r = tools["notes_read_file"].call
    res = await w({"path": "checkpoint.md", "text": "one\ntwo\nthree\n"}, cc(world))
    assert not res.is_error and res.details["created"] is True
    assert (await tools["notes_append_to_file"].call({"path": "checkpoint.md", "text": "four"}, cc(world))
            ).details["bytes"] == 18
    full = await r({"path": "checkpoint.md"}, cc(world))
    assert full.text.split("\n", 1)[1] == "one\ntwo\nthree\nfour"
    assert (await r({"path": "checkpoint.md", "start_line": -2}, cc(world))).text.endswith("\nthree\nfour")
    mid = await r({"path": "checkpoint.md", "start_line": 2, "stop_line": 3}, cc(world))
    assert mid.text.split("\n", 1)[1] == "two\nthree\n" and "lines 2-3 of 4" in mid.text
    zero = await r({"path": "checkpoint.md", "start_line": 0}, cc(world))
    assert zero.is_error and "1-based" in zero.text
    empty = await w({"path": "empty.md", "text": ""}, cc(world))
    assert not empty.is_error and empty.details["bytes"] == 0
    missing = await r({"path": "nope.md"}, cc(world))
    assert missing.is_error and "notes_list_files_by_prefix" in missing.text


async def test_long_line_pages_reconstruct(world, tools):
    line = "😀é" * 9000 + "\n"
    await tools["notes_write_file"].call({"path": "long.md", "text": "short\n" + line + "tail\n"}, cc(world))
    first = await tools["notes_read_file"].call({"path": "long.md", "start_line": 2, "stop_line": 2}, cc(world))
    assert 11_900 <= len(first.text) <= 12_000 and first.details["next_offset_chars"] is not None
    parts, off = [], 0
    while True:
        res = await tools["notes_read_file"].call({"path": "long.md", "start_line": 2, "stop_line": 2,
                                                   "offset_chars": off, "limit_chars": 4001}, cc(world))
        parts.append(res.text.split("\n", 1)[1])
        if res.details["next_offset_chars"] is None:
            break
        off = res.details["next_offset_chars"]
    assert "".join(parts) == line


async def test_list_prefix_and_order(world, tools):
    for name in ("checkpoint.md", "check/b.md", "alpha.md", "zeta.md"):
        await tools["notes_write_file"].call({"path": name, "text": name}, cc(world))
        time.sleep(0.01)
    await tools["notes_write_file"].call({"path": "alpha.md", "text": "rewritten later"}, cc(world))
    lst = tools["notes_list_files_by_prefix"].call
    assert [x["path"] for x in rows((await lst({"prefix": "check"}, cc(world))).text)] == ["check/b.md",
                                                                                          "checkpoint.md"]
    assert [x["path"] for x in rows((await lst({}, cc(world))).text)] == ["alpha.md", "check/b.md",
                                                                          "checkpoint.md", "zeta.md"]
    by_created = await lst({"file_order_by": "created_at", "file_order": "descending"}, cc(world))
    assert [x["path"] for x in rows(by_created.text)] == ["zeta.md", "alpha.md", "check/b.md", "checkpoint.md"]
    by_updated = await lst({"file_order_by": "updated_at", "file_order": "descending"}, cc(world))
    assert rows(by_updated.text)[0]["path"] == "alpha.md"
    limited = await lst({"max_results": 1000}, cc(world))
    assert "clamped to 500" in limited.text
    two = await lst({"max_results": 2}, cc(world))
    assert len(rows(two.text)) == 2 and "not shown" in two.text
    assert "stopped at max_results; raise max_results (up to 500)" in two.text  # seed 000 defect 8
    with pytest.raises(ToolError):
        await lst({"file_order_by": "size"}, cc(world))
    with pytest.raises(ToolError, match="belongs to notes_search_contents"):
        await lst({"path_prefix": "x"}, cc(world))


async def test_search(world, tools):
    w = tools["notes_write_file"].call
    await w({"path": "old.md", "text": "TODO one\nnothing\ntodo lower\nTODO two\n"}, cc(world))
    time.sleep(0.02)
    await w({"path": "new.md", "text": "TODO new\n"}, cc(world))
    time.sleep(0.02)
    await w({"path": "old.md", "text": "TODO one\nnothing\ntodo lower\nTODO two\nTODO three\n"}, cc(world))
    s = tools["notes_search_contents"].call
    res = await s({"query": "TODO"}, cc(world))
    assert res.text.splitlines()[1:] == ["new.md:1: TODO new", "old.md:1: TODO one", "old.md:4: TODO two",
                                         "old.md:5: TODO three"]
    recent = await s({"query": "TODO", "recent_file_first": True}, cc(world))
    assert recent.text.splitlines()[1].startswith("new.md:")  # creation time: the rewrite is not new
    capped = await s({"query": "TODO", "max_files": 1, "max_matches_per_file": 1, "path_prefix": "o"}, cc(world))
    assert capped.text.splitlines()[1:3] == ["old.md:1: TODO one", "old.md: [2 more matching lines]"]
    assert len((await s({"query": "todo"}, cc(world))).text.splitlines()) == 2  # case-sensitive
    assert (await s({"query": ""}, cc(world))).is_error


async def test_cross_agent_paths_in_task_and_refusal_outside(world, tools):
    services, task, other_task = world
    await tools["notes_write_file"].call({"path": "plan.md", "text": "child plan\n"}, cc(world, "reviewer"))
    read = await tools["notes_read_file"].call({"path": "/root/reviewer/notes/plan.md"}, cc(world))
    assert read.text.endswith("child plan\n")
    app = await tools["notes_append_to_file"].call({"path": "/root/reviewer/notes/plan.md", "text": "root adds\n"},
                                                   cc(world))
    assert not app.is_error
    listed = await tools["notes_list_files_by_prefix"].call({"prefix": "/root/reviewer/notes/"}, cc(world))
    assert rows(listed.text)[0]["path"] == "/root/reviewer/notes/plan.md"
    found = await tools["notes_search_contents"].call({"query": "adds", "path_prefix": "/root/reviewer/notes/"},
                                                      cc(world))
    assert "/root/reviewer/notes/plan.md:2: root adds" in found.text
    ghost = await tools["notes_read_file"].call({"path": "/root/ghost/notes/plan.md"}, cc(world))
    assert ghost.is_error and "unknown agent" in ghost.text
    outside = await tools["notes_read_file"].call({"path": "/root/reviewer/notes/plan.md"},
                                                  cc(world, task=other_task))
    assert outside.is_error and "unknown agent" in outside.text
    bad = await tools["notes_write_file"].call({"path": "a/../b.md", "text": "x"}, cc(world))
    assert bad.is_error and "'..'" in bad.text
    files = {p.relative_to(services.state.root).as_posix() for p in (services.state.root / "notes").rglob("*.md")
             if ".ctp" not in p.parts}
    assert len(files) == 1 and next(iter(files)).startswith(f"notes/{task}/")


def test_a_refused_write_leaves_no_directories(tmp_path: Path):
    store = NotesStore(tmp_path / "notes", "task_x", max_bytes=10)
    with pytest.raises(NoteError, match="limit is 10"):
        store.write("/root", "deep/er/note.md", "x" * 11)
    assert not (store.agent_dir("/root") / "deep").exists()
    assert store.write("/root", "deep/er/note.md", "x" * 10).created


async def test_note_paths_with_control_characters_are_refused_and_printed_escaped(world, tools):
    """Seed 000 defect 13: a newline in a note path would forge a hit line of notes_search_contents."""
    for bad in ("evil\nf000.md:1: fake.md", "tab\there.md", "cr\r.md", "sep\u2028x.md"):
        res = await tools["notes_write_file"].call({"path": bad, "text": "QQQ real"}, cc(world))
        assert res.is_error and "control characters" in res.text, bad
    from proxy.notes.paths import NoteRef

    assert NoteRef("/root", "old\nname.md", False).shown() == '"old\\nname.md"'  # one made before: escaped
    ok = await tools["notes_write_file"].call({"path": "fine.md", "text": "QQQ real"}, cc(world))
    assert not ok.is_error
    found = await tools["notes_search_contents"].call({"query": "QQQ"}, cc(world))
    assert found.text.splitlines()[1:] == ["fine.md:1: QQQ real"]
