"""The journal with its writer thread and SQLite: ids, branches, windows API, tasks, aliases."""

from __future__ import annotations

import json
import random
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.journal import JoinError, Journal
from proxy.journal.query import HistoryReader, ItemFilter
from proxy.session import SessionIdentity
from proxy.state import StateDir


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(StateDir.open(tmp_path / "state"))
    yield j
    j.close()


def _db(j: Journal) -> sqlite3.Connection:
    conn = sqlite3.connect(j.state.db_path)
    conn.row_factory = sqlite3.Row
    return conn


def _ident(key: str = "f:conv1", task: str | None = None, agent: str | None = None) -> SessionIdentity:
    return SessionIdentity(key, "header" if task else "fingerprint", task, agent, "gpt-5")


def _open(j: Journal, ident: SessionIdentity, payload: dict | None = None):
    key, task, addr = j.resolve(ident, {}, payload or {})
    return j.session(key, task, addr, ident.source)


def _respond(j: Journal, mark, items, rid=None, **kw):
    return j.ingest_response(mark, items, response_id=rid, model="gpt-5", status="completed",
                             usage={"input_tokens": 10, "output_tokens": 2}, error=None, incomplete=False, **kw)


def _msg(role: str, text: str) -> dict:
    return {"role": role, "content": text}


def _out(text: str, n: int) -> dict:
    return {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _resent(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def test_conversation_is_journaled_once_with_stable_ids(journal: Journal):
    s = _open(journal, _ident())
    m1 = journal.ingest_request(s, {"input": "hi"})
    out1 = _respond(journal, m1, [{"type": "reasoning", "id": "rs_1", "summary": []}, _out("hello", 1)], "resp_1")
    m2 = journal.ingest_request(s, {"input": [_msg("user", "hi"), _resent("hello"), _msg("user", "more")]})
    assert m2.kind == "continue"
    assert m2.input_ids[0] == m1.input_ids[0] and m2.input_ids[1] == out1[1]
    out2 = _respond(journal, m2, [_out("sure", 2)], "resp_2")
    # The same request again (a client retry) re-uses every id.
    m3 = journal.ingest_request(s, {"input": [_msg("user", "hi"), _resent("hello"), _msg("user", "more")]})
    assert m3.input_ids == m2.input_ids and m3.kind == "prefix"
    assert journal.flush()
    db = _db(journal)
    rows = db.execute("SELECT item_id, origin, role, type, upstream_id, response_id FROM journal_items ORDER BY seq"
                      ).fetchall()
    assert [r["item_id"] for r in rows] == [m1.input_ids[0], *out1, m2.input_ids[2], *out2]
    assert [r["origin"] for r in rows] == ["input", "output", "output", "input", "output"]
    assert rows[2]["upstream_id"] == "msg_1" and rows[2]["response_id"] == "resp_1"
    branch = [r[0] for r in db.execute("SELECT item_id FROM journal_branch ORDER BY pos")]
    # The retry branches off before its answer: the old answer waits off-branch for the new one.
    assert branch == [r["item_id"] for r in rows][:-1]
    assert journal.ingest_response(m3, [_out("sure", 2)], response_id="resp_3", model=None, status=None,
                                   usage=None, error=None, incomplete=False) == out2
    resp = db.execute("SELECT * FROM journal_responses WHERE response_id='resp_2'").fetchone()
    assert resp["tail_item_id"] == out2[0] and resp["item_count"] == 1 and '"input_tokens":10' in resp["usage"]


def test_edit_creates_a_second_branch_and_keeps_the_first(journal: Journal):
    s = _open(journal, _ident())
    m1 = journal.ingest_request(s, {"input": [_msg("user", "a")]})
    o1 = _respond(journal, m1, [_out("A", 1)], "r1")
    m2 = journal.ingest_request(s, {"input": [_msg("user", "a"), _resent("A"), _msg("user", "b")]})
    o2 = _respond(journal, m2, [_out("B", 2)], "r2")
    old_branch = journal.item_ids_for_session(s.key)
    m3 = journal.ingest_request(s, {"input": [_msg("user", "a"), _resent("A"), _msg("user", "b (edited)")]})
    assert m3.kind == "diverged" and m3.input_ids[:2] == m2.input_ids[:2] and m3.input_ids[2] != m2.input_ids[2]
    o3 = _respond(journal, m3, [_out("B2", 3)], "r3")
    assert journal.item_ids_for_session(s.key) == [m1.input_ids[0], o1[0], m3.input_ids[2], o3[0]]
    assert journal.flush()
    db = _db(journal)
    assert db.execute("SELECT count(*) FROM journal_items").fetchone()[0] == 6  # both branches kept
    heads = db.execute("SELECT head_item_id, length, reason FROM journal_branch_heads").fetchall()
    assert [tuple(h) for h in heads] == [(old_branch[-1], 4, "diverged")]
    assert o2[0] == old_branch[-1]
    assert [r[0] for r in db.execute("SELECT item_id FROM journal_branch ORDER BY pos")] == \
        journal.item_ids_for_session(s.key)
    assert any(e["kind"] == "branch" for e in journal.events(s.key))


def test_branch_survives_a_restart(tmp_path: Path):
    state = StateDir.open(tmp_path / "state")
    j1 = Journal(state)
    s = _open(j1, _ident())
    m1 = j1.ingest_request(s, {"input": [_msg("user", "a")]})
    o1 = _respond(j1, m1, [_out("A", 1)], "r1")
    j1.close()
    j2 = Journal(state)
    try:
        s2 = _open(j2, _ident())
        assert j2.item_ids_for_session(s2.key) == [m1.input_ids[0], *o1]
        m2 = j2.ingest_request(s2, {"input": [_msg("user", "a"), _resent("A"), _msg("user", "b")]})
        assert m2.kind == "continue" and m2.input_ids[:2] == [m1.input_ids[0], o1[0]]
        assert j2.current_window(s2.key).window_id == "w1"
        assert j2.session_for_response("r1") == s2.key
    finally:
        j2.close()


def test_previous_response_id_appends_after_that_response(journal: Journal):
    s = _open(journal, _ident())
    m1 = journal.ingest_request(s, {"input": "a"})
    o1 = _respond(journal, m1, [_out("A", 1)], "r1")
    m2 = journal.ingest_request(s, {"input": "b", "previous_response_id": "r1"})
    assert m2.kind == "stateful"
    o2 = _respond(journal, m2, [_out("B", 2)], "r2")
    assert journal.item_ids_for_session(s.key) == [m1.input_ids[0], o1[0], m2.input_ids[0], o2[0]]
    # Branching off the first response again.
    m3 = journal.ingest_request(s, {"input": "c", "previous_response_id": "r1"})
    assert m3.kind == "diverged"
    assert journal.item_ids_for_session(s.key) == [m1.input_ids[0], o1[0], m3.input_ids[0]]


def test_windows_api(journal: Journal):
    s = _open(journal, _ident())
    assert journal.current_window(s.key).window_id == "w1"
    m1 = journal.ingest_request(s, {"input": [_msg("user", "a")]})
    o1 = _respond(journal, m1, [_out("A", 1)], "r1")
    assert journal.chain_head(s.key) == o1[0]
    with pytest.raises(ValueError):
        journal.start_window(s.key, "it_not_on_branch", "notes", {})
    w2 = journal.start_window(s.key, o1[0], "notes", {"index": ["checkpoint.md"]})
    assert (w2.window_id, w2.ordinal, w2.boundary_item_id) == ("w2", 2, o1[0])
    assert journal.current_window(s.key) == w2
    m2 = journal.ingest_request(s, {"input": [_msg("user", "a"), _resent("A"), _msg("user", "b")]})
    assert m2.window_id == "w2"
    journal.alias_response("resp_merged", s.key)
    assert journal.session_for_response("resp_merged") == s.key
    assert journal.aliases["resp_merged"] == s.key and "nope" not in journal.aliases
    journal.record_event(s.key, "compaction", {"strategy": "notes", "items": 2})
    assert journal.flush()
    assert [w.window_id for w in journal.windows(s.key)] == ["w1", "w2"]
    assert journal.windows(s.key)[1].bootstrap == {"index": ["checkpoint.md"]}
    kinds = [e["kind"] for e in journal.events(s.key)]
    assert "window" in kinds and "compaction" in kinds
    db = _db(journal)
    win = {r[0]: r[1] for r in db.execute("SELECT item_id, window_id FROM journal_items")}
    assert win[m1.input_ids[0]] == "w1" and win[m2.input_ids[2]] == "w2"


def test_client_compaction_opens_a_window_and_keeps_old_items(journal: Journal):
    s = _open(journal, _ident())
    m1 = journal.ingest_request(s, {"input": [_msg("user", "a")]})
    o1 = _respond(journal, m1, [_out("A", 1)], "r1")
    comp = {"type": "compaction", "encrypted_content": "opaque"}
    m2 = journal.ingest_request(s, {"input": [_msg("user", "a"), comp, _msg("user", "next")]})
    assert m2.kind == "compaction" and m2.window_id == "w2"
    branch = journal.item_ids_for_session(s.key)
    assert branch[:2] == [m1.input_ids[0], o1[0]] and branch[2:] == m2.input_ids
    # The next turn resends the compacted history: it is recognised, nothing new but the tail.
    o2 = _respond(journal, m2, [_out("N", 2)], "r2")
    m3 = journal.ingest_request(s, {"input": [_msg("user", "a"), comp, _msg("user", "next"), _resent("N"),
                                              _msg("user", "last")]})
    assert m3.kind in ("trimmed", "continue") and m3.input_ids[:4] == [*m2.input_ids, o2[0]]


def test_tasks_and_agents(journal: Journal):
    with pytest.raises(JoinError) as err:
        journal.resolve(_ident("t:x", task="task_unknown", agent="reviewer"), {}, {})
    assert err.value.status == 400 and err.value.code == "unknown_task"
    assert err.value.body()["error"]["code"] == "unknown_task"
    root = _open(journal, _ident("f:root"))
    assert root.address == "/root" and root.task_id.startswith("task_")
    child = _open(journal, _ident("t:c", task=root.task_id, agent="reviewer"))
    assert (child.task_id, child.address) == (root.task_id, "/root/reviewer")
    again = _open(journal, _ident("t:c2", task=root.task_id, agent="/root/reviewer"))
    assert again.key == child.key  # one session per (task, agent)
    anon1 = journal.resolve(_ident("t:a", task=root.task_id), {"session_id": "one"}, {})
    anon2 = journal.resolve(_ident("t:a", task=root.task_id), {"session_id": "two"}, {})
    assert anon1[2].startswith("/root/agent_") and anon1[2] != anon2[2]
    assert anon1 == journal.resolve(_ident("t:a", task=root.task_id), {"session_id": "one"}, {})
    with pytest.raises(JoinError) as bad:
        journal.resolve(_ident("t:b", task=root.task_id, agent="../x"), {}, {})
    assert bad.value.code == "invalid_agent"
    other = _open(journal, _ident("f:other"))
    assert other.task_id != root.task_id  # never shared by accident
    fresh = journal.create_task()
    assert journal.task_exists(fresh)
    assert journal.resolve(_ident("t:z", task=fresh, agent="/root"), {}, {})[1:] == (fresh, "/root")
    assert journal.flush()
    reader = HistoryReader(_db(journal))
    assert reader.agents(root.task_id) == ["/root", "/root/reviewer"]


def test_outputs_take_namespace_and_name_from_their_call(journal: Journal):
    s = _open(journal, _ident())
    m1 = journal.ingest_request(s, {"input": "go"})
    _respond(journal, m1, [
        {"type": "function_call", "call_id": "c1", "namespace": "history", "name": "list_items", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
    ], "r1")
    branch = [{"type": "function_call", "call_id": "c1", "namespace": "history", "name": "list_items",
               "arguments": "{}"},
              {"type": "function_call", "call_id": "c2", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"}]
    journal.ingest_request(s, {"input": [_msg("user", "go"), *branch,
                                         {"type": "function_call_output", "call_id": "c1", "output": "[]"},
                                         {"type": "function_call_output", "call_id": "c2", "output": "a.txt"},
                                         {"type": "function_call_output", "call_id": "zz", "output": "?",
                                          "name": "notes_read_file"}]})
    assert journal.flush()
    rows = {r["call_id"]: r for r in _db(journal).execute(
        "SELECT call_id, role, tool_namespace, tool_name, hidden FROM journal_items WHERE type='function_call_output'")}
    assert (rows["c1"]["tool_namespace"], rows["c1"]["tool_name"], rows["c1"]["hidden"]) == ("history", "list_items", 1)
    assert (rows["c2"]["tool_namespace"], rows["c2"]["tool_name"], rows["c2"]["hidden"]) == ("functions",
                                                                                             "exec_command", 0)
    assert (rows["zz"]["tool_namespace"], rows["zz"]["tool_name"]) == ("notes", "read_file")
    assert all(r["role"] == "tool" for r in rows.values())
    reader = HistoryReader(_db(journal))
    visible, _ = reader.list_items(s.task_id, s.address, ItemFilter(), 50, False, 400)
    assert {r.call_id for r in visible if r.call_id} == {"c2"}
    hist, _ = reader.list_items(s.task_id, s.address, ItemFilter(tool_namespace="history"), 50, False, 400)
    assert [r.type for r in hist] == ["function_call", "function_call_output"]


def test_writer_flush_and_stats(journal: Journal):
    s = _open(journal, _ident())
    for i in range(300):
        m = journal.ingest_request(s, {"input": [_msg("user", f"q{i}")], "previous_response_id": None})
        _respond(journal, m, [_out(f"a{i}", i)], f"r{i}")
    assert journal.flush()
    assert journal.writer.stats.ops >= 600 and journal.writer.stats.failed_batches == 0
    # A batch closes once it reaches batch_size ops; the unit that crossed it (one request's ops) stays whole.
    assert journal.writer.stats.max_batch < journal.writer.batch_size + 16
    assert _db(journal).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_cli_views(tmp_path: Path, capsys):
    from proxy.app.cli import main
    from proxy.app.journal_views import new_task, tasks_report

    state = StateDir.open(tmp_path / "state")
    assert tasks_report(state).startswith("no tasks yet")
    task = new_task(state)
    j = Journal(state)
    try:
        s = _open(j, _ident("t:x", task=task, agent="/root"))
        m = j.ingest_request(s, {"input": "a"})
        _respond(j, m, [_out("A", 1)], "r1")
        j.start_window(s.key, j.chain_head(s.key), "notes", {})
        j.record_event(s.key, "compaction", {"strategy": "notes"})
        j.ingest_request(s, {"input": [_msg("user", "a"), _resent("A"), _msg("user", "b")]})
        assert j.flush()
    finally:
        j.close()
    report = tasks_report(state)
    assert f"task {task}" in report and "  /root  (1 session)" in report
    assert "w1 start 2 items, w2 notes 1 items" in report
    assert "3 on the current branch, 3 journaled" in report and "compactions 1" in report
    assert main(["task", "--state-dir", str(state.root), "new"]) == 0
    fresh = capsys.readouterr().out.strip()
    assert fresh.startswith("task_") and fresh != task
    assert main(["tasks", "--state-dir", str(state.root)]) == 0
    assert fresh in capsys.readouterr().out


def _conversation(rng, j: Journal, key: str, fast: bool) -> list[tuple[list[str], list[str]]]:
    """Random client behaviour: new turns, retries, edits, dropped reasoning, trimmed prefixes."""
    s = _open(j, _ident(key))
    history: list[dict] = []
    out: list[tuple[list[str], list[str]]] = []
    for turn in range(40):
        action = rng.choice(["turn", "turn", "turn", "retry", "edit", "trim", "drop_reasoning"])
        if action == "edit" and history:
            i = rng.randrange(len(history))
            history = [*history[:i], _msg("user", f"edited {turn}")]
        elif action == "trim" and len(history) > 4:
            history = history[2:]
        elif action == "drop_reasoning":
            history = [h for h in history if h.get("type") != "reasoning"]
        if action != "retry" or not history:
            history.append(_msg("user", f"q{turn}"))
        if not fast:
            for k in list(j._resends):
                j._resend_drop(k)
        mark = j.ingest_request(s, {"input": list(history)})
        outputs = [{"type": "reasoning", "summary": [{"type": "summary_text", "text": f"r{turn}"}]},
                   _out(f"a{turn}", turn)]
        ids = _respond(j, mark, outputs, f"{key}-{turn}")
        history += [outputs[0], _resent(f"a{turn}")]
        out.append((mark.input_ids, j.item_ids_for_session(s.key)))
        assert ids
    assert j.flush()
    db = _db(j)
    # The window counts kept with the manifest equal a recount of the current branch.
    recount = {tuple(r) for r in db.execute(
        "SELECT i.window_id, sum(NOT (i.hidden OR i.control)), sum(i.hidden OR i.control) FROM journal_branch b"
        " JOIN journal_items i ON i.item_id = b.item_id WHERE b.session_key=? GROUP BY 1", (s.key,))}
    kept = {tuple(r) for r in db.execute(
        "SELECT window_id, visible, hidden FROM journal_window_counts WHERE session_key=?"
        " AND (visible OR hidden)", (s.key,))}
    assert kept == recount
    assert [r[0] for r in db.execute("SELECT item_id FROM journal_branch WHERE session_key=? ORDER BY pos",
                                     (s.key,))] == j.item_ids_for_session(s.key)
    return out


def test_fast_resend_path_gives_the_same_ids_as_item_by_item(tmp_path: Path):
    import random

    for seed in range(16):
        runs = []
        for fast in (True, False):
            j = Journal(StateDir.open(tmp_path / f"s{seed}{fast}"))
            try:
                runs.append(_conversation(random.Random(seed), j, "f:same", fast))
            finally:
                j.close()
        assert runs[0] == runs[1]


def _lazy_conversation(rng, j: Journal, key: str, lazy: bool,
                       as_sent: bool = False) -> list[tuple[list[str], str, list[str]]]:
    """The request path's API (`begin_request` / `end_response`, settled whenever the writer or a reader
    gets to it) against the inline one, on the same random client behaviour, with concurrent turns.
    `as_sent`: the request path hands over the client's own bytes of the input (a client that writes JSON with
    spaces, unlike orjson), as it does for a big body."""
    ident = _ident(key)
    k, task, addr = j.resolve(ident, {}, {})
    history: list[dict] = []
    marks = []
    settle_rng = random.Random(rng.random())
    for turn in range(30):
        action = rng.choice(["turn", "turn", "turn", "retry", "edit", "drop_reasoning", "stateful", "overlap"])
        if action == "edit" and history:
            history = [*history[:rng.randrange(len(history))], _msg("user", f"edited {turn}")]
        elif action == "drop_reasoning":
            history = [h for h in history if h.get("type") != "reasoning"]
        if action != "retry" or not history:
            history.append(_msg("user", f"q{turn}"))
        payload: dict = {"input": list(history)}
        if action == "stateful" and marks:
            payload = {"input": [_msg("user", f"s{turn}")], "previous_response_id": f"{key}-{turn - 1}"}
        outputs = [{"type": "reasoning", "summary": [{"type": "summary_text", "text": f"r{turn}"}]},
                   _out(f"a{turn}", turn)]
        second = [_out(f"b{turn}", 100 + turn)]
        meta = {"model": "gpt-5", "status": "completed", "usage": None, "error": None, "incomplete": False}
        if lazy:
            sent = json.dumps(payload["input"]).encode() if as_sent and isinstance(payload["input"], list) else None
            mark = j.begin_request(k, task, addr, "fingerprint", payload, sent)
            payload["input"].append(_msg("user", "edited by a later addon"))  # the snapshot is what counts
            other = j.begin_request(k, task, addr, "fingerprint", {"input": list(history)}) \
                if action == "overlap" else None
            j.end_response(mark, outputs, response_id=f"{key}-{turn}", **meta)
            if other is not None:
                j.end_response(other, second, response_id=f"{key}-o{turn}", **meta)
            if settle_rng.random() < 0.3:
                j.settle()
        else:
            mark = j.ingest_request(j.session(k, task, addr), payload)
            other = j.ingest_request(j.session(k), {"input": list(history)}) if action == "overlap" else None
            j.ingest_response(mark, outputs, response_id=f"{key}-{turn}", **meta)
            if other is not None:
                j.ingest_response(other, second, response_id=f"{key}-o{turn}", **meta)
        history += [outputs[0], _resent(f"a{turn}")]
        marks.append(mark)
    out = [(m.input_ids, m.kind, [e.item_id for e in m.branch]) for m in marks]
    out.append((j.item_ids_for_session(k), "final", []))
    assert j.flush()
    assert [r[0] for r in _db(j).execute("SELECT item_id FROM journal_branch WHERE session_key=? ORDER BY pos",
                                         (k,))] == j.item_ids_for_session(k)
    return out


def test_request_path_backlog_gives_the_same_journal_as_inline(tmp_path: Path):
    for seed in range(12):
        runs = []
        for lazy, as_sent in ((True, False), (False, False), (True, True)):
            j = Journal(StateDir.open(tmp_path / f"l{seed}{lazy}{as_sent}"))
            try:
                runs.append(_lazy_conversation(random.Random(seed), j, "f:lazy", lazy, as_sent))
                # Everything left for later reached the database without anyone asking (the writer's tick).
                if lazy:
                    assert not j._backlog
            finally:
                j.close()
        assert runs[0] == runs[1] == runs[2]
        assert any(kind in ("prefix", "diverged") for _, kind, _ in runs[0])


def test_a_mark_settles_when_read_and_a_failed_request_drops_its_answer(journal: Journal):
    k, task, addr = journal.resolve(_ident("f:settle"), {}, {})
    mark = journal.begin_request(k, task, addr, "fingerprint", {"input": "hello"})
    assert not mark.settled and mark.address == "/root"
    assert mark.kind == "new" and len(mark.input_ids) == 1 and mark.settled
    bad = journal.begin_request(k, task, addr, "fingerprint", {"input": [{"role": "user", "content": "x"}]})
    bad.state = None  # an entry the journal cannot process: logged, marked failed, the rest goes on
    journal.end_response(bad, [_out("lost", 1)], response_id="r-bad", model=None, status=None, usage=None,
                         error=None, incomplete=False)
    ok = journal.begin_request(k, task, addr, "fingerprint", {"input": [_msg("user", "hello"), _msg("user", "b")]})
    assert bad.kind == "failed" and bad.input_ids == []
    assert ok.kind == "continue" and ok.input_ids[0] == mark.input_ids[0]
    assert journal.item_ids_for_session(k) == ok.input_ids


def _search(j: Journal, s, query: str, recent_first: bool = False, limit: int = 50) -> tuple[list[str], bool]:
    reader = HistoryReader(_db(j))
    hits, more = reader.search(s.task_id, s.address, query, ItemFilter(), limit, recent_first)
    return [h.row.item_id for h in hits], more


def test_search_reads_the_index_and_the_items_not_indexed_yet_alike(tmp_path: Path):
    from proxy.journal.sqlite_backend import index_text
    from proxy.journal.writer import JournalWriter

    state = StateDir.open(tmp_path / "state")
    j = Journal(state, JournalWriter(state.db_path, index_items=10_000, index_delay=3600))
    try:
        s = _open(j, _ident("f:fts"))
        history: list[dict] = []
        for i in range(12):
            history.append(_msg("user", f"turn {i} " + ("a needle here" if i % 3 == 0 else "hay")))
            m = j.ingest_request(s, {"input": list(history)})
            _respond(j, m, [_out(f"answer {i} needle" if i % 4 == 0 else f"answer {i}", i)], f"r{i}")
            history.append(_resent(f"answer {i} needle" if i % 4 == 0 else f"answer {i}"))
        assert j.flush()
        db = _db(j)

        def indexed() -> int:
            return db.execute("SELECT indexed_seq FROM journal_fts_state").fetchone()[0]

        assert indexed() == 0 and j.writer.stats.indexed == 0  # nothing indexed yet: all scanned
        before = {(q, rf, lim): _search(j, s, q, rf, lim) for q in ("needle", "answer 1", "nope", "ne")
                  for rf in (False, True) for lim in (2, 50)}
        assert len(before[("needle", False, 50)][0]) == 7 and before[("needle", False, 2)][1]
        # Index half of the items (as a writer would have, earlier): the same hits, in the same order.
        half = db.execute("SELECT seq FROM journal_items ORDER BY seq LIMIT 1 OFFSET 11").fetchone()[0]
        db.execute("UPDATE journal_fts_state SET indexed_seq = 0")
        db.execute("INSERT INTO journal_fts(rowid, text) SELECT seq, text FROM journal_items WHERE seq <= ?",
                   (half,))
        db.execute("UPDATE journal_fts_state SET indexed_seq = ?", (half,))
        db.commit()
        assert {k: _search(j, s, *k) for k in before} == before
        assert index_text(db) == 24 - 12 and indexed() == db.execute("SELECT max(seq) FROM journal_items").fetchone()[0]
        assert {k: _search(j, s, *k) for k in before} == before
        assert db.execute("""SELECT count(*) FROM journal_fts WHERE journal_fts MATCH '"needle"'""").fetchone()[0] == 7
        assert index_text(db) == 0  # idempotent: nothing twice
    finally:
        j.close()


def test_writer_indexes_in_bulk_by_count_by_age_and_on_close(tmp_path: Path):
    from proxy.journal.writer import JournalWriter

    def indexed(state: StateDir) -> int:
        conn = sqlite3.connect(state.db_path)
        try:
            return conn.execute("SELECT indexed_seq FROM journal_fts_state").fetchone()[0]
        finally:
            conn.close()

    def turns(j: Journal, n: int) -> None:  # n turns, 2 new items each
        s = _open(j, _ident("f:bulk"))
        for _ in range(n):
            i = len(j.item_ids_for_session(s.key))
            m = j.ingest_request(s, {"input": [_msg("user", f"q{i}")], "previous_response_id": f"r{i - 1}"
                                     if i else None})
            _respond(j, m, [_out(f"a{i}", i)], f"r{i}")

    def until(cond) -> bool:  # right after the drain that the flush waited for
        deadline = time.monotonic() + 10
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.02)
        return cond()

    state = StateDir.open(tmp_path / "count")
    j = Journal(state, JournalWriter(state.db_path, index_items=6, index_delay=3600))
    turns(j, 2)
    assert j.flush() and indexed(state) == 0  # 4 items: not enough yet
    turns(j, 1)
    assert j.flush() and until(lambda: indexed(state) == 6) and j.writer.stats.index_runs == 2  # (+1 at start)
    turns(j, 1)
    j.close()
    assert indexed(state) == 8  # close indexes the rest

    state = StateDir.open(tmp_path / "age")
    j = Journal(state, JournalWriter(state.db_path, index_items=10_000, index_delay=0.3))
    try:
        turns(j, 1)
        assert j.flush() and indexed(state) == 0
        assert until(lambda: indexed(state) == 2)  # the sleeping writer wakes for it
    finally:
        j.close()
