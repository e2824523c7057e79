"""The one window model (issue 11, build 4; ADR 0006): checkpoints are journal windows, one canonical form
and one hash chain for the journal's branch and the projection's boundary, the migration of a state
database made by the code before it, and the context stage alone under `mitmdump -s addons/context.py`."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import orjson
import pytest

from proxy.db import connect
from proxy.items.canonical import canonical_hash, chain_at, chain_ids, item_type, legacy_chain_hash, session_root
from proxy.journal import Journal, migrate
from proxy.journal.identity import auto_task_id
from proxy.session import resolve_session
from proxy.state import StateDir
from proxy.windows.apply import WindowProjection, apply_window, boundary_matches
from proxy.windows.fallback import fallback_message, fallback_text, is_fallback_message, marker
from proxy.windows.remote import store
from proxy.windows.remote.bootstraps import CompactionRecord, ProjectionContext, apply_projection
from proxy.windows.remote.journal_link import journal_boundary
from proxy.windows.remote.store import Checkpoint
from tests.addons.test_standalone_addons import mitmdump, sdk  # noqa: F401  (fixtures)
from tests.emulator import Emulator


def user(text):
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


# What the model produced (ids, statuses, parts, an encrypted reasoning blob) and what an agent that
# keeps none of that resends: the same conversation.
PRODUCED = [
    user("first question"),
    {"id": "rs_1", "type": "reasoning", "status": "completed", "encrypted_content": "gAAAA-opaque",
     "summary": [{"type": "summary_text", "text": "thinking"}]},
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "first answer", "annotations": []}]},
    user("second question"),
]
RESENT = [
    user("first question"),
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
    {"role": "assistant", "content": "first answer"},
    user("second question"),
]


# ---- one canonical form, one hash chain --------------------------------------------------------------


def test_the_old_chains_disagreed_on_this_sequence_the_one_chain_does_not():
    # The old compaction chain saw an edit (string content, no encrypted_content) …
    assert legacy_chain_hash(PRODUCED, 3) != legacy_chain_hash(RESENT, 3)
    # … the one chain, like the journal always did, sees the same items.
    root = session_root("sess-1")
    assert chain_ids(PRODUCED, root) == chain_ids(RESENT, root)
    # A real edit still changes the chain from that item on.
    edited = [*RESENT[:2], {"role": "assistant", "content": "another answer"}, RESENT[3]]
    ids, edited_ids = chain_ids(RESENT, root), chain_ids(edited, root)
    assert ids[:2] == edited_ids[:2] and ids[2] != edited_ids[2] and ids[3] != edited_ids[3]
    # A compaction item's encrypted_content is all it says: it counts.
    a = {"type": "compaction", "encrypted_content": "A"}
    b = {"type": "compaction", "encrypted_content": "B"}
    assert chain_ids([a], root) != chain_ids([b], root)


def test_journal_branch_and_projection_boundary_agree(tmp_path: Path):
    """The journal journals the produced items; the agent resends them stripped: the journal calls it the
    same branch, and a window opened on the journal's boundary item projects the resent items."""
    journal = Journal(StateDir.open(tmp_path / "state"))
    try:
        st = journal.session("sess-1", "task_1", "/root")
        first = journal.ingest_request(st, {"input": PRODUCED})
        boundary_item = first.input_ids[2]  # the assistant answer, as the journal named it
        # The journal's ids are the one chain of the agent's items from the session's root.
        assert first.input_ids == chain_ids(PRODUCED, session_root("sess-1"))
        again = journal.ingest_request(st, {"input": [*RESENT, user("third")]})
        assert again.kind == "continue" and again.input_ids[:4] == first.input_ids
        w = journal.start_window("sess-1", None, "fallback",
                                 checkpoint_bootstrap("cp_agree"), boundary_pos=3,
                                 boundary_hash=chain_at(RESENT, session_root("sess-1"), 3), reason="threshold")
        assert w.boundary_item_id == boundary_item  # the boundary is on the journal's branch
        cp = Checkpoint.from_window(w)
        assert cp is not None
        out, outcome = apply_projection({"input": [*RESENT, user("third")]}, ProjectionContext(cp.record(), False))
        assert outcome == "fallback"
        assert is_fallback_message(out["input"][0]) and out["input"][1:] == [user("second question"), user("third")]
    finally:
        journal.close()


def test_an_agent_that_leaves_out_a_reasoning_item_keeps_its_window(tmp_path: Path):
    """The journal keeps a reasoning item the agent no longer sends; the positional boundary check then
    fails, and the boundary follows the journal's alignment instead (the two agree on the branch)."""
    journal = Journal(StateDir.open(tmp_path / "state"))
    try:
        st = journal.session("sess-2", "task_2", "/root")
        first = journal.ingest_request(st, {"input": PRODUCED})
        w = journal.start_window("sess-2", None, "fallback", checkpoint_bootstrap("cp_skip"), boundary_pos=3,
                                 boundary_hash=chain_at(PRODUCED, session_root("sess-2"), 3), reason="threshold")
        assert w.boundary_item_id == first.input_ids[2]
        without_reasoning = [RESENT[0], RESENT[2], RESENT[3], user("third")]
        payload = {"input": without_reasoning}
        mark = journal.ingest_request(st, payload)
        assert mark.kind == "continue"  # the journal: the same branch
        cp = Checkpoint.from_window(w)
        assert cp is not None
        assert apply_projection(payload, ProjectionContext(cp.record(), False))[1] == "diverged"  # by position
        moved = journal_boundary(mark, cp)
        assert moved is not None and moved.boundary == 2
        out, outcome = apply_projection(payload, ProjectionContext(moved.record(), False), checked=True)
        assert outcome == "fallback" and out["input"][1:] == [user("second question"), user("third")]
        # A real edit before the boundary: the journal does not find the boundary item either.
        edited = {"input": [user("first question, edited"), *without_reasoning[1:]]}
        assert journal_boundary(journal.ingest_request(st, edited), cp) is None
    finally:
        journal.close()


def checkpoint_bootstrap(cp_id: str) -> dict:
    return migrate.checkpoint_bootstrap(cp_id, marker(cp_id), fallback_text(cp_id, [user("the excerpt")]), [], None,
                                        None)


def test_window_projection_is_pure_and_idempotent():
    items = [user("a"), {"role": "assistant", "content": "b"}, user("c")]
    root = session_root("s")
    boot = (fallback_message("[marker] the excerpt"),)
    proj = WindowProjection("w2", 2, chain_at(items, root, 2) or "", root, boot)
    payload = {"model": "m", "input": items, "unknown_field": {"kept": True}}
    out, outcome = apply_window(payload, proj)
    assert outcome == "applied" and out["input"] == [*boot, user("c")] and out["unknown_field"] == {"kept": True}
    assert payload["input"] == items  # the input payload is not modified
    assert apply_window(out, proj) == (out, "already")
    diverged = {"input": [user("A"), *items[1:]]}
    assert apply_window(diverged, proj) == (diverged, "diverged")
    assert not boundary_matches(diverged["input"], proj)


def test_a_remembered_boundary_still_sees_an_edit():
    """The verified-boundary memo only skips work: an edited prefix after a verified one diverges."""
    items = [user(f"q{i}") for i in range(6)]
    root = session_root("memo")
    proj = WindowProjection("w9", 4, chain_at(items, root, 4) or "", root, (fallback_message("[m] x"),))
    assert boundary_matches(items, proj)
    assert boundary_matches(orjson.loads(orjson.dumps(items)), proj)  # resent: other objects, same bytes
    edited = [*items[:2], user("Q2"), *items[3:]]
    assert not boundary_matches(edited, proj)
    assert apply_window({"input": edited}, proj)[1] == "diverged"
    assert apply_window({"input": items}, proj)[1] == "applied"


# ---- migration of a database made by the code before the one window model ----------------------------

# The tables as the previous code created them (journal_windows without boundary columns, and the
# compaction store's own checkpoints); the other journal tables did not change.
OLD_DDL = """
CREATE TABLE journal_tasks (task_id TEXT PRIMARY KEY, origin TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE journal_agents (task_id TEXT NOT NULL, address TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (task_id, address)) WITHOUT ROWID;
CREATE TABLE journal_sessions (session_key TEXT PRIMARY KEY, task_id TEXT NOT NULL, address TEXT NOT NULL,
    source TEXT, created_at REAL NOT NULL);
CREATE TABLE journal_windows (
    task_id TEXT NOT NULL, address TEXT NOT NULL, window_id TEXT NOT NULL, ordinal INTEGER NOT NULL,
    session_key TEXT NOT NULL, boundary_item_id TEXT, strategy TEXT NOT NULL, bootstrap TEXT NOT NULL,
    created_at REAL NOT NULL, PRIMARY KEY (task_id, address, window_id)) WITHOUT ROWID;
CREATE TABLE journal_items (
    seq INTEGER PRIMARY KEY, item_id TEXT NOT NULL UNIQUE, session_key TEXT NOT NULL, parent_id TEXT,
    window_id TEXT NOT NULL, origin TEXT NOT NULL, type TEXT NOT NULL, role TEXT, tool_namespace TEXT,
    tool_name TEXT, call_id TEXT, upstream_id TEXT, response_id TEXT, control INTEGER NOT NULL DEFAULT 0,
    hidden INTEGER NOT NULL DEFAULT 0, canon_hash TEXT NOT NULL, text TEXT NOT NULL, segments TEXT NOT NULL,
    chars INTEGER NOT NULL, images INTEGER NOT NULL, created_at REAL NOT NULL);
CREATE TABLE journal_raw (seq INTEGER PRIMARY KEY, raw BLOB NOT NULL);
CREATE TABLE journal_branch (session_key TEXT NOT NULL, item_id TEXT NOT NULL, pos INTEGER NOT NULL,
    PRIMARY KEY (session_key, item_id)) WITHOUT ROWID;
CREATE TABLE compaction_checkpoints (
    id TEXT PRIMARY KEY, session_key TEXT NOT NULL, created_at REAL NOT NULL, strategy TEXT NOT NULL,
    reason TEXT NOT NULL, boundary INTEGER NOT NULL, boundary_hash TEXT NOT NULL, marker TEXT NOT NULL,
    fallback_text TEXT NOT NULL, compaction_item BLOB, retained_json BLOB NOT NULL,
    provider_kind TEXT, model TEXT, endpoint TEXT, auth_kind TEXT, account_hash TEXT, usage_json BLOB,
    window_id TEXT);
CREATE INDEX compaction_checkpoints_by_session ON compaction_checkpoints(session_key, created_at);
"""

OPAQUE = b'{"type":"compaction","id":"cmp_1","encrypted_content":"gAAAA\\u00e9-bytes as received"}'
FP = ("codex", "gpt-5", "http://x/backend-api/codex", "oauth", "ab" * 32)


def _journal_items(conn: sqlite3.Connection, key: str, items: list, window_id: str) -> list[str]:
    """Items journaled by the old code: the journal's ids were already the one chain."""
    ids = chain_ids(items, session_root(key))
    for pos, (item, item_id) in enumerate(zip(items, ids, strict=True)):
        cur = conn.execute(
            "INSERT INTO journal_items(item_id, session_key, parent_id, window_id, origin, type, canon_hash, text,"
            " segments, chars, images, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (item_id, key, ids[pos - 1] if pos else None, window_id, "input", item_type(item), canonical_hash(item),
             "t", "[]", 1, 0, 1.0))
        conn.execute("INSERT INTO journal_raw(seq, raw) VALUES (?,?)", (cur.lastrowid, orjson.dumps(item)))
        conn.execute("INSERT INTO journal_branch(session_key, item_id, pos) VALUES (?,?,?)", (key, item_id, pos))
    return ids


def _checkpoint(conn, cp_id, key, created, strategy, boundary, items, opaque, window_id):
    old_hash = (legacy_chain_hash(items, boundary) or "").removeprefix("v1:")
    conn.execute(
        "INSERT INTO compaction_checkpoints VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (cp_id, key, created, strategy, "threshold", boundary, old_hash, marker(cp_id),
         fallback_text(cp_id, items[:boundary]),
         opaque, orjson.dumps([items[0]]), *(FP if opaque else (None,) * 5),
         orjson.dumps({"input_tokens": 7}) if opaque else None, window_id))


def _old_database(path: Path) -> dict[str, list]:
    """A state database as the code before the one window model left it: three sessions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(OLD_DDL)
    items = {"s-linked": [user("a1"), {"role": "assistant", "content": "b1"}, user("c1")],
             "s-unlinked": [user("a2"), {"role": "assistant", "content": "b2"}, user("c2")],
             "s-nojournal": [user("a3"), {"role": "assistant", "content": "b3"}, user("c3")]}
    for key in ("s-linked", "s-unlinked"):
        conn.execute("INSERT INTO journal_tasks VALUES (?,?,?)", (auto_task_id(key), "session", 1.0))
        conn.execute("INSERT INTO journal_agents VALUES (?,?,?)", (auto_task_id(key), "/root", 1.0))
        conn.execute("INSERT INTO journal_sessions VALUES (?,?,?,?,?)", (key, auto_task_id(key), "/root", "x", 1.0))
        conn.execute("INSERT INTO journal_windows VALUES (?,?,?,?,?,?,?,?,?)",
                     (auto_task_id(key), "/root", "w1", 1, key, None, "start", "{}", 1.0))
        ids = _journal_items(conn, key, items[key], "w1")
        if key == "s-linked":  # the compaction opened the journal's window w2 at its boundary item
            conn.execute("INSERT INTO journal_windows VALUES (?,?,?,?,?,?,?,?,?)",
                         (auto_task_id(key), "/root", "w2", 2, key, ids[1], "remote",
                          orjson.dumps({"checkpoint_id": "cp_linked", "retained": 1}).decode(), 2.0))
    _checkpoint(conn, "cp_linked", "s-linked", 2.0, "remote", 2, items["s-linked"], OPAQUE, "w2")
    _checkpoint(conn, "cp_unlinked", "s-unlinked", 2.0, "fallback", 2, items["s-unlinked"], None, None)
    _checkpoint(conn, "cp_old", "s-nojournal", 2.0, "remote", 2, items["s-nojournal"], OPAQUE, None)
    _checkpoint(conn, "cp_new", "s-nojournal", 3.0, "fallback", 2, items["s-nojournal"], None, None)
    conn.commit()
    conn.close()
    return items


def test_migration_moves_every_checkpoint_into_the_journal_windows(tmp_path: Path):
    state = StateDir.open(tmp_path / "state")
    items = _old_database(state.db_path)
    journal = Journal(state)  # opening the journal migrates the database, once
    try:
        conn = connect(state.db_path)
        assert migrate.version(conn) == migrate.VERSION
        assert conn.execute("SELECT 1 FROM sqlite_master WHERE name='compaction_checkpoints'").fetchone() is None

        # Linked: the journal's own window w2 now is the checkpoint, its boundary hash the journal's item id.
        (linked,) = store.checkpoints(conn, "s-linked")
        assert (linked.id, linked.window_id, linked.strategy, linked.boundary) == ("cp_linked", "w2", "remote", 2)
        assert linked.boundary_hash == chain_at(items["s-linked"], session_root("s-linked"), 2)
        assert linked.compaction_item == OPAQUE  # byte for byte
        assert linked.fingerprint is not None and linked.fingerprint.account_hash == "ab" * 32
        assert linked.retained == (items["s-linked"][0],) and linked.usage == {"input_tokens": 7}
        assert journal.current_window("s-linked").window_id == "w2"

        # Unlinked, items in the journal: verified against the old hash, recomputed in the one chain.
        (unlinked,) = store.checkpoints(conn, "s-unlinked")
        assert unlinked.window_id == "w2" and unlinked.strategy == "fallback"
        assert unlinked.boundary_hash == chain_at(items["s-unlinked"], session_root("s-unlinked"), 2)
        assert journal.window_of("s-unlinked").boundary_item_id == unlinked.boundary_hash

        # No journal items (history was off): both checkpoints kept, in order, their old hash kept as v1.
        old, new = store.checkpoints(conn, "s-nojournal")
        assert [old.id, new.id] == ["cp_old", "cp_new"] and old.compaction_item == OPAQUE
        assert new.boundary_hash == legacy_chain_hash(items["s-nojournal"], 2)
        assert store.latest_checkpoint(conn, "s-nojournal") == new
        # … and the projection still checks it (with the old chain, for these windows only).
        resent = [*items["s-nojournal"], user("d3")]
        out, outcome = apply_projection({"input": resent}, ProjectionContext(new.record(), False))
        assert outcome == "fallback" and out["input"][1:] == [user("c3"), user("d3")]
        edited = [user("A3"), *resent[1:]]
        assert apply_projection({"input": edited}, ProjectionContext(new.record(), False))[1] == "diverged"

        # Idempotent: a second run (another process) changes nothing.
        before = conn.execute("SELECT * FROM journal_windows ORDER BY session_key, ordinal").fetchall()
        migrate._done.clear()
        migrate.ensure(conn)
        assert conn.execute("SELECT * FROM journal_windows ORDER BY session_key, ordinal").fetchall() == before
        conn.close()
    finally:
        journal.close()


def test_a_failing_migration_leaves_the_database_as_it_was(tmp_path: Path):
    path = tmp_path / "state" / "ctproxy.db"
    _old_database(path)
    raw = sqlite3.connect(path)
    raw.execute("UPDATE compaction_checkpoints SET retained_json=? WHERE id='cp_new'", (b"not json",))
    raw.commit()
    raw.close()
    conn = connect(path)
    migrate._done.clear()
    with pytest.raises(orjson.JSONDecodeError):
        migrate.ensure(conn)
    assert migrate.version(conn) == 1
    assert conn.execute("SELECT count(*) FROM compaction_checkpoints").fetchone()[0] == 4
    columns = {r[1] for r in conn.execute("PRAGMA table_info(journal_windows)")}
    assert "boundary_hash" not in columns  # the ALTERs were rolled back with the rest
    assert conn.execute("SELECT count(*) FROM journal_windows").fetchone()[0] == 3
    conn.close()


async def test_a_state_directory_from_before_keeps_its_checkpoint_through_the_proxy(tmp_path: Path, monkeypatch):
    """`ctproxy up` on a state directory the old code wrote: the stored checkpoint is migrated into the
    journal's windows and the next request of that session is projected with it."""
    from tests.proxy.windows.test_compaction_harness import codex_turn, running_proxy

    key = resolve_session({"session_id": "sess-e2e"}, {}).session_key
    history = [user("old turn one"), {"type": "message", "role": "assistant", "content": "old answer one"},
               user("old turn two")]
    path = tmp_path / "state" / "ctproxy.db"
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.executescript(OLD_DDL)
    conn.execute("INSERT INTO journal_tasks VALUES (?,?,?)", (auto_task_id(key), "session", 1.0))
    conn.execute("INSERT INTO journal_agents VALUES (?,?,?)", (auto_task_id(key), "/root", 1.0))
    conn.execute("INSERT INTO journal_sessions VALUES (?,?,?,?,?)", (key, auto_task_id(key), "/root", "codex", 1.0))
    conn.execute("INSERT INTO journal_windows VALUES (?,?,?,?,?,?,?,?,?)",
                 (auto_task_id(key), "/root", "w1", 1, key, None, "start", "{}", 1.0))
    _journal_items(conn, key, history, "w1")
    _checkpoint(conn, "cp_before", key, 2.0, "fallback", 2, history, None, None)
    conn.commit()
    conn.close()

    async with Emulator() as emu, running_proxy(tmp_path, emu.url, {}, monkeypatch) as base:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            status, _ = await codex_turn(http, base, {"model": "gpt-5", "input": [*history, user("new turn")],
                                                      "store": False})
        assert status == 200
        (sent,) = [r.json["input"] for r in emu.requests if r.route == "responses"]
    assert is_fallback_message(sent[0]) and marker("cp_before") in sent[0]["content"][0]["text"]
    assert "old answer one" in sent[0]["content"][0]["text"]  # the excerpt of what the checkpoint covers
    assert sent[1:] == [user("old turn two"), user("new turn")]


def test_a_new_strategy_is_one_entry():
    """Adding a strategy (notes, issue 13) is one function in proxy/windows/projection.PROJECTIONS."""
    from proxy.windows import projection

    assert set(projection.PROJECTIONS) >= {"remote", "fallback", "notes"}
    assert all(callable(f) for f in projection.PROJECTIONS.values())


# ---- the context stage alone --------------------------------------------------------------------------


async def test_context_alone_applies_the_current_window_and_records_a_divergence(tmp_path: Path, mitmdump,  # noqa: F811
                                                                                 sdk) -> None:  # noqa: F811
    history = [user("turn one"), {"role": "assistant", "content": "answer one"}, user("turn two")]
    payload = {"model": "gpt-5", "input": history, "prompt_cache_key": "ctx-standalone"}
    key = resolve_session({}, payload).session_key
    state = StateDir.open(tmp_path / "state-context-0")  # where the fixture's first mitmdump keeps its state
    journal = Journal(state)
    journal.session(key, auto_task_id(key), "/root", "test")
    rec = CompactionRecord("cp_ctx", 2, chain_at(history, session_root(key), 2) or "", (), None,
                           checkpoint_bootstrap("cp_ctx")["fallback_text"], session_root(key))
    w = journal.start_window(key, None, "fallback", checkpoint_bootstrap("cp_ctx"), boundary_pos=2,
                             boundary_hash=rec.boundary_hash, reason="threshold")
    journal.close()

    async with Emulator() as emu:
        md = mitmdump("context", emu.url, ctp_trust_upstream="true")
        client = sdk(md.url)
        await client.responses.create(model="gpt-5", input=history, prompt_cache_key="ctx-standalone")
        edited = [user("turn ONE"), *history[1:]]
        await client.responses.create(model="gpt-5", input=edited, prompt_cache_key="ctx-standalone")
        await client.responses.create(model="gpt-5", input=edited, prompt_cache_key="ctx-standalone")
        first, second, third = (r.json["input"] for r in emu.responses_requests)
        assert is_fallback_message(first[0]) and rec.fallback_text in first[0]["content"][0]["text"]
        assert first[1:] == [user("turn two")]
        assert second == edited and third == edited  # diverged: sent as it is
        assert md.stop() == 0

    conn = connect(state.db_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            rows = [orjson.loads(r[0]) for r in conn.execute(
                "SELECT detail FROM journal_events WHERE session_key=? AND kind='projection'", (key,))]
            if rows or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert rows == [{"outcome": "diverged", "window_id": w.window_id, "strategy": "fallback"}]  # once
    finally:
        conn.close()


# ---- a strategy that is not compaction's, in the whole chain ---------------------------------------------


async def test_another_strategy_is_applied_in_the_chain_after_compaction_decided(rt, monkeypatch):
    """One entry in PROJECTIONS and a window of that strategy: the chain (history, compaction, context, …)
    sends the window's bootstrap instead of the items before its boundary."""
    from mitmproxy.test import taddons, tflow, tutils

    from addons import chain
    from addons.chain_addon import ChainAddon
    from proxy.journal import journal_for
    from proxy.windows import projection

    monkeypatch.setitem(projection.PROJECTIONS, "notes", projection.stored_projection)
    items = [user("long ago"), {"type": "message", "role": "assistant", "content": "noted"}, user("now")]
    payload = {"model": "gpt-5", "input": items, "prompt_cache_key": "notes-chain"}
    key = resolve_session({}, payload).session_key
    boot = user("<bootstrap> the notes index </bootstrap>")
    journal = rt.services.journal = journal_for(rt.state)
    journal.session(key, auto_task_id(key), "/root", "test")
    journal.start_window(key, None, "notes", {"items": [boot]}, boundary_pos=2,
                         boundary_hash=chain_at(items, session_root(key), 2) or "", reason="new_context")

    addon = ChainAddon(chain())
    with taddons.context(addon):
        for body in (payload, {**payload, "input": [user("edited"), *items[1:]]}):
            req = tutils.treq(method=b"POST", scheme=b"https", host="api.openai.com", port=443,
                              path=b"/v1/responses", content=orjson.dumps(body),
                              headers=((b"content-type", b"application/json"), (b"authorization", b"Bearer sk-t")))
            flow = tflow.tflow(req=req)
            flow.response = None
            for hook in ("requestheaders", "request"):
                if (pending := getattr(addon, hook)(flow)) is not None:
                    await pending
            sent = orjson.loads(flow.request.content or b"")["input"]
            if body is payload:
                assert sent == [boot, user("now")]
            else:
                assert sent == body["input"]  # diverged: as the agent sent it
    journal.flush()
    assert [e["detail"]["outcome"] for e in journal.events(key) if e["kind"] == "projection"] == ["diverged"]
