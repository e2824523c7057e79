"""The store interface (proxy/store/interface.py, ADR 0013): one contract for notes, pending rollovers and usage,
held by the embedded store (SQLite + note files) and by PostgreSQL (a real private server, tests/support/postgres.py).

Every contract test runs on both. The two-instance tests open two stores on one state (two `EmbeddedStore` on
one state directory; two `PostgresStore`, each with its own connection pool, on one database), as two
`ctproxy up` would: a note written through A is read through B, a `new_context` marked through A is taken
through B, and appends and takes racing from both lose nothing and double nothing."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proxy.notes import NoteError, NotePathError
from proxy.state import StateDir
from proxy.store.embedded import EmbeddedStore
from proxy.store.interface import CompactionBackend, NotesBackend, RolloverBackend, Store, UsageBackend
from tests.support.postgres import unavailable

_COUNT = itertools.count()
Opener = Callable[[], Store]


@pytest.fixture(params=["embedded", "postgresql"])
def open_store(request, tmp_path: Path) -> Iterator[Opener]:
    """A function opening one more store on the same state: the test's state directory, or one fresh database."""
    opened: list[Store] = []
    if request.param == "embedded":
        state = StateDir.open(tmp_path / "state")

        def opener() -> Store:
            opened.append(EmbeddedStore(state))
            return opened[-1]
    else:
        if (why := unavailable()) is not None:
            pytest.skip(why)
        from proxy.store.pg import PostgresStore

        url = request.getfixturevalue("pg").fresh_database(f"iface{next(_COUNT)}")

        def opener() -> Store:
            opened.append(PostgresStore.open(url, max_size=4))
            return opened[-1]
    yield opener
    for store in opened:
        store.close()


# ------------------------------------------------------------------------------------------------ notes
def test_both_stores_hold_the_interface(open_store):
    store = open_store()
    assert isinstance(store, Store)
    assert isinstance(store.notes("task1"), NotesBackend)
    assert isinstance(store.rollovers, RolloverBackend)
    assert isinstance(store.usage, UsageBackend)
    assert isinstance(store.compaction(), CompactionBackend)


def test_notes_write_read_append(open_store):
    notes = open_store().notes("task1")
    first = notes.write("/root", "checkpoint.md", "half done\n")
    assert (first.bytes, first.written, first.created) == (10, 10, True)
    assert notes.read("/root", "checkpoint.md") == "half done\n"
    more = notes.append("/root", "checkpoint.md", "ünï\n")
    assert (more.bytes, more.written, more.created) == (16, 6, False)
    assert notes.read("/root", "checkpoint.md") == "half done\nünï\n"
    fresh = notes.append("/root", "deep/dir/log.md", "one\n")
    assert fresh.created and notes.read("/root", "deep/dir/log.md") == "one\n"
    again = notes.write("/root", "checkpoint.md", "replaced")
    assert (again.bytes, again.created) == (8, False)
    assert notes.read("/root", "checkpoint.md") == "replaced"


def test_notes_errors_are_the_embedded_stores_words(open_store):
    notes = open_store().notes("task1")
    with pytest.raises(NoteError, match=r"note 'nope.md' does not exist; list notes with notes_list_files_by_prefix"):
        notes.read("/root", "nope.md")
    notes.write("/root", "dir/a.md", "a")
    with pytest.raises(NoteError, match=r"'dir' is a directory; list it with notes_list_files_by_prefix"):
        notes.read("/root", "dir")
    with pytest.raises(NoteError, match=r"'dir' is a directory; choose a file name inside it"):
        notes.write("/root", "dir", "x")
    with pytest.raises(NoteError, match=r"cannot use 'dir/a.md/b.md': 'dir/a.md' is a file, not a directory"):
        notes.write("/root", "dir/a.md/b.md", "x")
    with pytest.raises(NotePathError):
        notes.write("/root", "../escape.md", "x")
    with pytest.raises(NotePathError):
        open_store().notes("bad task!")
    with pytest.raises(NoteError, match="lone surrogate"):
        notes.write("/root", "s.md", "\ud800")


def test_notes_byte_cap_refuses_whole_and_changes_nothing(open_store):
    notes = open_store().notes("task1")
    notes.max_bytes = 10
    notes.write("/root", "n.md", "12345678")
    with pytest.raises(NoteError, match=r"would be 11 bytes; the limit is 10 UTF-8 bytes per file \(it has 8; 2 "):
        notes.append("/root", "n.md", "abc")
    assert notes.read("/root", "n.md") == "12345678"
    with pytest.raises(NoteError, match=r"would be 11 bytes; the limit is 10"):
        notes.write("/root", "n.md", "x" * 11)
    assert notes.read("/root", "n.md") == "12345678"


def test_notes_listing_is_per_agent_and_created_at_survives(open_store):
    notes = open_store().notes("task1")
    notes.write("/root", "b.md", "bb")
    notes.write("/root", "a/x.md", "x")
    notes.write("/root/helper", "h.md", "helper's")
    before = {n.rel: n for n in notes.iter_files("/root")}
    assert sorted(before) == ["a/x.md", "b.md"]
    assert before["b.md"].bytes == 2 and before["b.md"].created_at <= before["b.md"].updated_at
    notes.append("/root", "b.md", "more")
    after = {n.rel: n for n in notes.iter_files("/root")}
    assert after["b.md"].bytes == 6
    assert after["b.md"].created_at == before["b.md"].created_at
    assert [n.rel for n in notes.iter_files("/root/helper")] == ["h.md"]
    assert list(open_store().notes("task2").iter_files("/root")) == []


# ------------------------------------------------------------------------------------------------ rollovers
def test_rollover_mark_is_idempotent_and_checkpoint_wins(open_store):
    roll = open_store().rollovers
    assert roll.peek("t", "/root") is None
    first = roll.mark("t", "/root", "new_context", "tool", "w1")
    assert (first.kind, first.origin, first.window_id) == ("new_context", "tool", "w1")
    again = roll.mark("t", "/root", "new_context", "cli")
    assert again == first  # the earlier mark keeps its time and origin
    stronger = roll.mark("t", "/root", "checkpoint", "rest")
    assert (stronger.kind, stronger.origin, stronger.requested_at) == ("checkpoint", "rest", first.requested_at)
    assert roll.mark("t", "/root", "new_context").kind == "checkpoint"  # never weakened
    assert roll.peek("t", "/root") == roll.peek("t", "/root")  # peeking consumes nothing
    with pytest.raises(ValueError):
        roll.mark("t", "/root", "other")  # type: ignore[arg-type]


def test_rollover_take_once_and_by_kind(open_store):
    roll = open_store().rollovers
    roll.mark("t", "/root", "checkpoint", "tool")
    assert roll.take("t", "/root", ("new_context",)) is None  # a checkpoint mark is left for who can run it
    taken = roll.take("t", "/root")
    assert taken is not None and taken.checkpoint
    assert roll.take("t", "/root") is None and roll.peek("t", "/root") is None
    roll.mark("t", "/root/helper")
    assert roll.take("t", "/root") is None  # another agent's mark is its own
    assert roll.take("t", "/root/helper") is not None


# ------------------------------------------------------------------------------------------------ usage
def test_usage_keeps_the_newest_answer_and_estimates(open_store):
    usage = open_store().usage
    assert usage.for_session("s1") is None and usage.for_agent("t", "/root") is None
    assert usage.estimate_for_agent("t", "/root") is None
    usage.record_estimate("s1", "t", "/root", "gpt-5", 1200, at=100.0)
    est = usage.estimate_for_agent("t", "/root")
    assert est is not None and (est.input_tokens, est.output_tokens, est.model) == (1200, 0, "gpt-5")
    usage.record_estimate("s1", "t", "/root", "gpt-5", 1300, at=101.0)
    assert usage.estimate_for_agent("t", "/root").input_tokens == 1300  # type: ignore[union-attr]
    usage.record("s1", "t", "/root", "gpt-5", {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12},
                 "resp_2", at=200.0)
    usage.record("s1", "t", "/root", "gpt-5", {"input_tokens": 5, "output_tokens": 1}, "resp_1", at=150.0)
    got = usage.for_session("s1")
    assert got is not None
    assert (got.input_tokens, got.output_tokens, got.total_tokens, got.response_id, got.updated_at) == \
        (10, 2, 12, "resp_2", 200.0)  # the late write of an older answer changed nothing
    usage.record("s2", "t", "/root", "gpt-5-mini", {"input_tokens": 7}, None, at=300.0)
    newest = usage.for_agent("t", "/root")
    assert newest is not None and (newest.session_key, newest.output_tokens, newest.total_tokens) == ("s2", 0, None)
    assert usage.for_agent("other-task", "/root") is None and usage.for_agent("t", "/root/helper") is None


# ------------------------------------------------------------------------------------------------ compaction
def test_compaction_records_per_session(open_store):
    rec = open_store().compaction()
    assert rec.session_state("s1") is None
    rec.record_compacted("s1", 40)  # alone: the count at the last compaction is known, nothing forwarded yet
    got = rec.session_state("s1")
    assert got is not None and (got.last.checkpoint_id, got.last.client_items, got.last.sent_bytes) == (None, 0, 0)
    assert (got.force_compact, got.failed_items, got.compacted_items) == (False, None, 40)
    rec.record_forwarded("s1", "cp_1", 42, 9000)
    rec.mark_force_compact("s1")
    rec.mark_failed("s1", 42)
    got = rec.session_state("s1")
    assert got is not None and (got.last.checkpoint_id, got.last.client_items, got.last.sent_bytes) == \
        ("cp_1", 42, 9000)  # a forced compaction and a failure keep what was forwarded
    assert (got.force_compact, got.failed_items, got.compacted_items) == (True, 42, 40)
    rec.record_forwarded("s1", None, 43, 9100)  # a new request clears the forced compaction
    got = rec.session_state("s1")
    assert got is not None and (got.last.checkpoint_id, got.last.client_items, got.force_compact) == \
        (None, 43, False)
    assert got.failed_items == 42
    rec.mark_force_compact("s2")  # a session seen first by its forced compaction
    got = rec.session_state("s2")
    assert got is not None and (got.force_compact, got.last.client_items, got.compacted_items) == (True, 0, None)


def test_compaction_events_and_learned_windows(open_store):
    rec = open_store().compaction()
    assert rec.events() == [] and rec.learned_window("gpt-5", "https://api/v1/responses") is None
    for i in range(5):
        rec.record_event("s1" if i % 2 == 0 else "s2", "compaction", "remote", f"r{i}", f"cp_{i}")
    rec.record_event("s1", "recovery", "recovered")
    got = rec.events("s1")
    assert [(e.kind, e.outcome, e.reason, e.checkpoint_id) for e in got] == [
        ("compaction", "remote", "r0", "cp_0"), ("compaction", "remote", "r2", "cp_2"),
        ("compaction", "remote", "r4", "cp_4"), ("recovery", "recovered", None, None)]  # oldest first
    assert all(e.session_key == "s1" and e.at > 0 for e in got)
    assert [e.reason for e in rec.events(limit=3)] == ["r3", "r4", None]  # the newest 3 of all sessions
    assert [e.checkpoint_id for e in rec.events("s2", limit=1)] == ["cp_3"]
    rec.learn_window("gpt-5", "https://api/v1/responses", 120_000)
    rec.learn_window("gpt-5", "https://api/v1/responses", 150_000)  # larger: the smallest seen is kept
    assert rec.learned_window("gpt-5", "https://api/v1/responses") == 120_000
    rec.learn_window("gpt-5", "https://api/v1/responses", 100_000)
    assert rec.learned_window("gpt-5", "https://api/v1/responses") == 100_000
    assert rec.learned_window("gpt-5", "https://other/v1/responses") is None


def test_compaction_records_written_through_a_are_read_through_b(open_store):
    a, b = open_store(), open_store()
    a.compaction().record_forwarded("s1", "cp_a", 10, 500)
    a.compaction().record_compacted("s1", 8)
    a.compaction().record_event("s1", "compaction", "fallback", "threshold", "cp_a")
    a.compaction().learn_window("m", "e", 5000)
    got = b.compaction().session_state("s1")
    assert got is not None and (got.last.checkpoint_id, got.compacted_items) == ("cp_a", 8)
    assert [e.checkpoint_id for e in b.compaction().events("s1")] == ["cp_a"]
    assert b.compaction().learned_window("m", "e") == 5000
    b.compaction().mark_force_compact("s1")
    assert a.compaction().session_state("s1").force_compact  # type: ignore[union-attr]


def test_the_view_reads_what_the_journal_of_another_instance_wrote(open_store):
    """`Store.view()` (the dashboard's API, `ctproxy tasks` / `show`, `tasks_report`) on both stores: what was
    journaled and recorded through A is listed through B's view, by position and by column name."""
    import time

    from proxy.app import sessionview
    from proxy.config import Config
    from proxy.journal.ops import EnsureTask

    a, b = open_store(), open_store()
    a.journal().apply([EnsureTask("task_view1", "cli", time.time())])
    a.compaction().record_event("s_view", "compaction", "remote", "threshold", "cp_v")
    view = b.view()
    try:
        tasks = sessionview.list_tasks(view)
        assert [t.task_id for t in tasks] == ["task_view1"] and tasks[0].origin == "cli"
        assert sessionview.resolve(view, "task_vi") == ("task", "task_view1")
        plot = sessionview.session_plot(view, "s_view", Config())
        assert [m.label for m in plot.markers] == ["compaction remote"]
    finally:
        view.close()


def test_a_view_gives_its_connection_back_as_it_came(pg):
    """The dashboard's view runs on the tool server's own pool: the connection it used writes again afterwards."""
    if (why := unavailable()) is not None:
        pytest.skip(why)
    from proxy.store.pg import PostgresStore

    store = PostgresStore.open(pg.fresh_database(f"iface{next(_COUNT)}"), max_size=1)  # one connection: the same
    try:
        view = store.view()
        assert view.execute("SELECT count(*) FROM journal_tasks").fetchone()[0] == 0
        view.close()
        store.notes("task1").write("/root", "after-view.md", "written on the view's connection")
        store.rollovers.mark("task1", "/root")
        assert store.notes("task1").read("/root", "after-view.md") == "written on the view's connection"
    finally:
        store.close()


# ------------------------------------------------------------------------------------------------ two instances
def test_a_note_written_through_a_is_read_through_b(open_store):
    a, b = open_store(), open_store()
    a.notes("task1").write("/root", "checkpoint.md", "written through A\n")
    assert b.notes("task1").read("/root", "checkpoint.md") == "written through A\n"
    b.notes("task1").append("/root", "checkpoint.md", "appended through B\n")
    assert a.notes("task1").read("/root", "checkpoint.md") == "written through A\nappended through B\n"
    assert [n.rel for n in b.notes("task1").iter_files("/root")] == ["checkpoint.md"]


def test_new_context_marked_through_a_is_taken_by_b_once(open_store):
    a, b = open_store(), open_store()
    marked = a.rollovers.mark("task1", "/root", "new_context", "tool", "w1")
    assert b.rollovers.peek("task1", "/root") == marked
    assert b.rollovers.take("task1", "/root") == marked
    assert a.rollovers.take("task1", "/root") is None


def test_usage_recorded_through_a_is_read_through_b(open_store):
    a, b = open_store(), open_store()
    a.usage.record("s1", "t", "/root", "gpt-5", {"input_tokens": 900, "output_tokens": 100}, "resp_a")
    got = b.usage.for_agent("t", "/root")
    assert got is not None and (got.input_tokens, got.response_id) == (900, "resp_a")


def test_appends_racing_from_two_instances_all_land(open_store):
    stores = [open_store(), open_store()]
    per_thread, threads = 15, 4
    errors: list[BaseException] = []

    def run(i: int) -> None:
        notes = stores[i % 2].notes("task1")
        try:
            for k in range(per_thread):
                notes.append("/root", "log.md", f"{i}:{k}\n")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert errors == []
    lines = stores[0].notes("task1").read("/root", "log.md").splitlines()
    assert sorted(lines) == sorted(f"{i}:{k}" for i in range(threads) for k in range(per_thread))


def test_takes_racing_from_two_instances_get_a_mark_once(open_store):
    stores = [open_store(), open_store()]
    for round_ in range(5):
        stores[round_ % 2].rollovers.mark("task1", "/root", "new_context")
        got: list[object] = []
        barrier = threading.Barrier(4)

        def run(i: int, barrier: threading.Barrier, got: list[object]) -> None:
            barrier.wait()
            got.append(stores[i % 2].rollovers.take("task1", "/root"))

        workers = [threading.Thread(target=run, args=(i, barrier, got)) for i in range(4)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        assert len([p for p in got if p is not None]) == 1


# ------------------------------------------------------------------------------------------------ two tool servers
def _tool_server(root: Path, store: Store, task: str) -> tuple[object, dict]:
    """One tool server's services, with its own state directory (token, run files) and the shared store, whose
    journal holds the task (registered idempotently, as the proxy's writer does); its notes and context tools by
    name."""
    from proxy.config import Config
    from proxy.journal.ops import EnsureTask
    from tools_server.context import create_family as context_family
    from tools_server.notes import create_family as notes_family
    from tools_server.registry import Services

    state = StateDir.open(root)
    store.journal().apply([EnsureTask(task, "cli", 0.0)])
    services = Services(Config(), state, root, store=store)
    families = [notes_family(services), context_family(services)]
    return services, {"families": families, **{t.name: t for f in families for t in f.tools()}}


async def test_two_tool_servers_on_one_postgresql_share_notes_and_rollovers(pg, tmp_path: Path):
    if (why := unavailable()) is not None:
        pytest.skip(why)
    from proxy.store.pg import PostgresStore
    from tools_server.registry import CallContext

    url = pg.fresh_database(f"tools{next(_COUNT)}")
    a_store, b_store = PostgresStore.open(url, max_size=2), PostgresStore.open(url, max_size=2)
    a_tools: dict = {"families": []}
    b_tools: dict = {"families": []}
    try:
        a, a_tools = _tool_server(tmp_path / "a", a_store, "team1")
        b, b_tools = _tool_server(tmp_path / "b", b_store, "team1")
        res = await a_tools["notes_write_file"].call({"path": "checkpoint.md", "text": "through A\n"},
                                                     CallContext(a, task="team1"))
        assert not res.is_error, res.text
        res = await b_tools["notes_append_to_file"].call({"path": "checkpoint.md", "text": "through B\n"},
                                                         CallContext(b, task="team1"))
        assert not res.is_error, res.text
        read = await b_tools["notes_read_file"].call({"path": "checkpoint.md"}, CallContext(b, task="team1"))
        assert read.text.endswith("through A\nthrough B\n")
        listed = await a_tools["notes_list_files_by_prefix"].call({}, CallContext(a, task="team1"))
        assert '"path":"checkpoint.md"' in listed.text and '"bytes":20' in listed.text
        found = await a_tools["notes_search_contents"].call({"query": "through B"}, CallContext(a, task="team1"))
        assert "checkpoint.md" in found.text
        assert not any(p.is_file() for p in (tmp_path / "a" / "notes").rglob("*"))  # contents in the database
        assert not any(p.is_file() for p in (tmp_path / "b" / "notes").rglob("*"))

        marked = await a_tools["new_context"].call({}, CallContext(a, task="team1"))
        assert not marked.is_error and marked.details["pending_rollover"] == "new_context"
        seen = await b_tools["get_context_remaining"].call({}, CallContext(b, task="team1"))
        assert seen.details["pending_rollover"] == "new_context"
        assert "A new context window is pending" in seen.text
        taken = b_store.rollovers.take("team1", "/root")  # what B's proxy does at the agent's next request
        assert taken is not None and taken.kind == "new_context"
        assert a_store.rollovers.peek("team1", "/root") is None
    finally:
        for tools in (a_tools, b_tools):
            for fam in tools["families"]:
                await fam.close()
        a_store.close()
        b_store.close()


async def test_the_proxys_rollover_store_takes_through_postgresql_what_another_instance_marked(pg):
    """The projection stage's `RolloverStore` given the PostgreSQL backend (what `--store` will hand it): a
    `new_context` marked through instance A is taken by instance B's proxy at the agent's next request, once."""
    if (why := unavailable()) is not None:
        pytest.skip(why)
    from proxy.store.pg import PostgresStore
    from proxy.windows.notes.rollover import RolloverStore

    url = pg.fresh_database(f"proxy{next(_COUNT)}")
    a, b = PostgresStore.open(url, max_size=2), PostgresStore.open(url, max_size=2)
    try:
        b_proxy = RolloverStore(None, backend=b.rollovers)
        assert await b_proxy.take("team1", "/root") is None
        a.rollovers.mark("team1", "/root", "new_context", "tool", "w1")
        assert b_proxy.may_be_pending("team1", "/root")  # nothing trusted without asking
        taken = await b_proxy.take("team1", "/root")
        assert taken is not None and (taken.kind, taken.window_id) == ("new_context", "w1")
        assert await b_proxy.take("team1", "/root") is None and a.rollovers.peek("team1", "/root") is None
        await b_proxy.mark("team1", "/root", "checkpoint", "cli")
        assert a.rollovers.peek("team1", "/root").kind == "checkpoint"  # type: ignore[union-attr]
        assert await b_proxy.take("team1", "/root", ("new_context",)) is None
        assert (await b_proxy.peek("team1", "/root")) == a.rollovers.peek("team1", "/root")
    finally:
        a.close()
        b.close()


def test_a_postgresql_store_that_went_away_is_a_store_error_and_the_notes_index_says_unavailable(pg):
    if (why := unavailable()) is not None:
        pytest.skip(why)
    import psycopg

    from proxy.store.pg import PostgresStore
    from proxy.store.postgres import StoreError
    from proxy.windows.opening import notes_snapshot

    name = f"gone{next(_COUNT)}"
    store = PostgresStore.open(pg.fresh_database(name), min_size=1, max_size=1, timeout=1.0)
    try:
        store.notes("t").write("/root", "a.md", "x")
        with psycopg.connect(pg.admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        with pytest.raises(StoreError, match="the PostgreSQL store cannot be used"):
            store.notes("t").read("/root", "a.md")
        assert notes_snapshot(store, "t", "/root").files is None  # the bootstrap says "index unavailable"
        with pytest.raises(StoreError):
            store.rollovers.peek("t", "/root")
    finally:
        store.close()
