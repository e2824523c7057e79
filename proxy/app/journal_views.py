"""`ctproxy tasks` and `ctproxy task new`: the journal's tasks, agents, windows and counts, in text."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from proxy.db import connect
from proxy.journal import schema as _schema  # noqa: F401  (registers the tables)
from proxy.journal.identity import new_task_id
from proxy.journal.ops import EnsureTask
from proxy.state import StateDir
from proxy.store.interface import JournalBackend, Store


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def new_task(state: StateDir, journal: JournalBackend | None = None) -> str:
    """Register a fresh task id (to hand to the agents of one job as x-ctp-task) and return it: in `journal`, the
    store's (every proxy on that store checks x-ctp-task against it), else in the state directory's own."""
    task_id = new_task_id()
    if journal is not None:
        journal.apply([EnsureTask(task_id, "cli", time.time())])
        return task_id
    conn = connect(state.db_path)
    try:
        conn.execute("INSERT INTO journal_tasks(task_id, origin, created_at) VALUES (?,?,?)",
                     (task_id, "cli", time.time()))
        return task_id
    finally:
        conn.close()


def tasks_report(state: StateDir, store: Store | None = None) -> str:
    """Tasks, their agents and sessions, each session's windows with item counts, and its events: read from
    `store`'s view (`Store.view()`: a shared store's, whichever instance journaled them), else from the state
    directory's database."""
    conn = store.view() if store is not None else connect(state.db_path)
    try:
        tasks = conn.execute("SELECT task_id, origin, created_at FROM journal_tasks ORDER BY created_at").fetchall()
        if not tasks:
            return "no tasks yet: they appear when requests pass through the proxy (or `ctproxy task new`)"
        agents: dict[str, list[str]] = defaultdict(list)
        for r in conn.execute("SELECT task_id, address FROM journal_agents ORDER BY address"):
            agents[r[0]].append(r[1])
        sessions: dict[tuple[str, str], list] = defaultdict(list)
        for r in conn.execute("SELECT session_key, task_id, address, source FROM journal_sessions ORDER BY created_at"):
            sessions[(r[1], r[2])].append(r)
        windows: dict[str, list] = defaultdict(list)
        for r in conn.execute("SELECT session_key, window_id, strategy FROM journal_windows ORDER BY ordinal"):
            windows[r[0]].append(r)
        on_branch: dict[tuple[str, str], int] = {}
        for r in conn.execute("SELECT session_key, window_id, visible + hidden FROM journal_window_counts"):
            on_branch[(r[0], r[1])] = r[2]
        journaled = dict(conn.execute("SELECT session_key, count(*) FROM journal_items GROUP BY session_key"))
        archived = dict(conn.execute("SELECT session_key, count(*) FROM journal_branch_heads GROUP BY session_key"))
        events: dict[str, Counter] = defaultdict(Counter)
        for r in conn.execute("SELECT session_key, kind, count(*) FROM journal_events GROUP BY session_key, kind"):
            events[r[0]][r[1]] = r[2]
        out: list[str] = []
        for t in tasks:
            task_id = t["task_id"]
            out.append(f"task {task_id}  (created {_when(t['created_at'])}, by {t['origin']})")
            if not agents.get(task_id):
                out.append("  no agents yet")
            for address in agents.get(task_id, []):
                sess = sessions.get((task_id, address), [])
                out.append(f"  {address}  ({len(sess)} session{'s' if len(sess) != 1 else ''})")
                for s in sess:
                    key = s["session_key"]
                    wins = ", ".join(f"{w['window_id']} {w['strategy']} {on_branch.get((key, w['window_id']), 0)} items"
                                     for w in windows.get(key, []))
                    branch_total = sum(n for (k, _), n in on_branch.items() if k == key)
                    ev = events.get(key, Counter())
                    compactions = sum(n for k, n in ev.items() if "compaction" in k)
                    recoveries = sum(n for k, n in ev.items() if "recover" in k)
                    out.append(f"    session {key} via {s['source'] or '?'}: windows [{wins}]")
                    out.append(f"      items: {branch_total} on the current branch, {journaled.get(key, 0)} journaled,"
                               f" {archived.get(key, 0)} other branch(es); compactions {compactions},"
                               f" recoveries {recoveries}")
                    others = {k: n for k, n in ev.items() if "compaction" not in k and "recover" not in k}
                    if others:
                        out.append("      events: " + ", ".join(f"{k} {n}" for k, n in sorted(others.items())))
        return "\n".join(out)
    finally:
        conn.close()
