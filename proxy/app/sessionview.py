"""Read-only views of the journal for people: `ctproxy tasks`, `ctproxy show`, and the dashboard's API.

Plain queries over the journal's tables (proxy/journal/schema.py) and the compaction checkpoints; nothing
here writes. Windows are read as the journal has them (`journal_windows`, every column it has), so a new
window strategy shows up here, in the CLI and in the dashboard's plot markers without a change.

Previews are the journal's canonical safe text (`journal_items.text`: images and opaque items already
replaced by placeholders), clipped; a whole item is printed only when asked for by id (`--item`).
"""

from __future__ import annotations

import sqlite3
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.config import Config
from proxy.db import connect
from proxy.journal import schema as _schema  # noqa: F401  (registers the tables)
from proxy.journal.query import bridged_counts
from proxy.state import StateDir
from proxy.windows import budget
from proxy.windows.remote import store as compaction_store

PREVIEW_CHARS = 100
LABEL_WORDS = 8
HOLD_FRACTION = 0.9  # addons/compaction.HOLD_FRACTION: above it an answer is held for overflow recovery


@dataclass
class WindowView:
    window_id: str
    ordinal: int
    strategy: str
    created_at: float
    items: int
    bootstrap: str  # what replaces the items before the boundary, summarised (kinds and counts)
    reason: str | None = None


@dataclass
class SessionView:
    session_key: str
    task_id: str
    agent: str
    source: str | None
    created_at: float
    items: int  # journaled (every branch)
    responses: int
    windows: list[WindowView] = field(default_factory=list)
    other_branches: int = 0
    events: dict[str, int] = field(default_factory=dict)  # the journal's events by kind (compaction, recovery, …)
    bridged_rounds: int = 0  # the tool bridge: rounds of calls ctproxy ran (proxy.journal.query.bridged_counts)
    bridged_calls: int = 0

    @property
    def on_branch(self) -> int:
        return sum(w.items for w in self.windows)


@dataclass
class AgentView:
    address: str
    sessions: list[SessionView] = field(default_factory=list)


@dataclass
class TaskView:
    task_id: str
    origin: str
    created_at: float
    last_activity: float
    label: str
    agents: list[AgentView] = field(default_factory=list)

    @property
    def sessions(self) -> int:
        return sum(len(a.sessions) for a in self.agents)

    @property
    def items(self) -> int:
        return sum(s.items for a in self.agents for s in a.sessions)

    @property
    def bridged_rounds(self) -> int:
        return sum(s.bridged_rounds for a in self.agents for s in a.sessions)

    @property
    def bridged_calls(self) -> int:
        return sum(s.bridged_calls for a in self.agents for s in a.sessions)


@dataclass
class ItemView:
    seq: int
    item_id: str
    window_id: str
    origin: str
    type: str
    role: str | None
    name: str | None
    preview: str
    created_at: float


@dataclass
class PlotPoint:
    at: float
    input_tokens: int
    output_tokens: int
    model: str | None
    window_id: str | None


@dataclass
class PlotMarker:
    at: float
    kind: str  # window (a new window: rollover, compaction…) | compaction event
    label: str  # the window's strategy, or the event's kind and outcome


@dataclass
class PlotLine:
    label: str
    tokens: int


@dataclass
class SessionPlot:
    session_key: str
    window: int | None  # the model's context window (config model_windows)
    points: list[PlotPoint]
    markers: list[PlotMarker]
    lines: list[PlotLine]


def open_db(state: StateDir) -> sqlite3.Connection:
    return connect(state.db_path)


def _clip(text: str, n: int = PREVIEW_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def _bootstrap_summary(raw: Any) -> str:
    try:
        data = orjson.loads(raw) if isinstance(raw, str | bytes) else raw
    except orjson.JSONDecodeError:
        return "?"
    if not data:
        return "none"
    if isinstance(data, dict):
        parts = []
        for k, v in sorted(data.items()):
            n = len(v) if isinstance(v, list | dict | str) else None
            parts.append(f"{k}({n})" if isinstance(v, list) else k)
        return ", ".join(parts)[:120]
    return type(data).__name__


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    if getattr(conn, "dialect", "sqlite") != "sqlite":
        return True  # the PostgreSQL store's schema has every table (its migrations)
    return conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None


def _windows(conn: sqlite3.Connection, keys: list[str]) -> dict[str, list[WindowView]]:
    out: dict[str, list[WindowView]] = defaultdict(list)
    if not keys:
        return out
    counts = {(r[0], r[1]): r[2] for r in conn.execute(
        "SELECT session_key, window_id, visible + hidden FROM journal_window_counts")}
    marks = ",".join("?" * len(keys))
    for r in conn.execute(f"SELECT * FROM journal_windows WHERE session_key IN ({marks}) ORDER BY ordinal", keys):
        cols = r.keys()
        out[r["session_key"]].append(WindowView(
            window_id=r["window_id"], ordinal=r["ordinal"], strategy=r["strategy"], created_at=r["created_at"],
            items=counts.get((r["session_key"], r["window_id"]), 0), bootstrap=_bootstrap_summary(r["bootstrap"]),
            reason=r["reason"] if "reason" in cols else None))
    return out


def _labels(conn: sqlite3.Connection, task_ids: list[str]) -> dict[str, str]:
    """Each task's first user words (its earliest user message's text)."""
    out: dict[str, str] = {}
    for task_id in task_ids:
        row = conn.execute(
            "SELECT i.text FROM journal_items i JOIN journal_sessions s ON s.session_key = i.session_key "
            "WHERE s.task_id = ? AND i.role = 'user' AND i.control = 0 AND i.text != '' ORDER BY i.seq LIMIT 1",
            (task_id,)).fetchone()
        if row is not None:
            words = row[0].split()
            out[task_id] = " ".join(words[:LABEL_WORDS]) + (" …" if len(words) > LABEL_WORDS else "")
    return out


def list_tasks(conn: sqlite3.Connection, limit: int | None = None, task_id: str | None = None) -> list[TaskView]:
    """Tasks, newest first (by their last activity), each with its agents, sessions and windows."""
    # (the SQL both stores speak: the last activity is the greatest of three, taken here, then the order and limit)
    where, args = ("WHERE t.task_id = ?", [task_id]) if task_id else ("", [])
    sql = ("SELECT t.task_id, t.origin, t.created_at, coalesce(max(s.created_at), 0) AS s_last, "
           "coalesce((SELECT max(r.created_at) FROM journal_responses r JOIN journal_sessions s2 "
           "ON s2.session_key = r.session_key WHERE s2.task_id = t.task_id), 0) AS r_last "
           f"FROM journal_tasks t LEFT JOIN journal_sessions s ON s.task_id = t.task_id {where} "
           "GROUP BY t.task_id, t.origin, t.created_at")
    rows = [{"task_id": r["task_id"], "origin": r["origin"], "created_at": r["created_at"],
             "last": max(r["created_at"], r["s_last"], r["r_last"])} for r in conn.execute(sql, args)]
    rows.sort(key=lambda r: r["task_id"])
    rows.sort(key=lambda r: r["last"], reverse=True)
    if limit is not None:
        rows = rows[:int(limit)]
    ids = [r["task_id"] for r in rows]
    if not ids:
        return []
    marks = ",".join("?" * len(ids))
    agents: dict[str, list[str]] = defaultdict(list)
    for r in conn.execute(f"SELECT task_id, address FROM journal_agents WHERE task_id IN ({marks}) "
                          "ORDER BY address", ids):
        agents[r[0]].append(r[1])
    sessions: dict[tuple[str, str], list[sqlite3.Row]] = defaultdict(list)
    keys: list[str] = []
    for r in conn.execute(f"SELECT * FROM journal_sessions WHERE task_id IN ({marks}) ORDER BY created_at", ids):
        sessions[(r["task_id"], r["address"])].append(r)
        keys.append(r["session_key"])
    windows = _windows(conn, keys)
    km = ",".join("?" * len(keys)) or "''"
    items = dict(conn.execute(f"SELECT session_key, count(*) FROM journal_items WHERE session_key IN ({km}) "
                              "GROUP BY session_key", keys)) if keys else {}
    responses = dict(conn.execute(f"SELECT session_key, count(*) FROM journal_responses WHERE session_key IN "
                                  f"({km}) GROUP BY session_key", keys)) if keys else {}
    labels = _labels(conn, ids)
    archived = dict(conn.execute(f"SELECT session_key, count(*) FROM journal_branch_heads WHERE session_key IN "
                                 f"({km}) GROUP BY session_key", keys)) if keys else {}
    events: dict[str, dict[str, int]] = defaultdict(dict)
    if keys:
        for e in conn.execute(f"SELECT session_key, kind, count(*) FROM journal_events WHERE session_key IN ({km}) "
                              "GROUP BY session_key, kind", keys):
            events[e[0]][e[1]] = e[2]
    bridged = bridged_counts(conn, keys)
    out: list[TaskView] = []
    for r in rows:
        tid = r["task_id"]
        names = agents.get(tid, [])
        for (t, address) in sessions:  # a session may name an agent the agents table has not got yet
            if t == tid and address not in names:
                names.append(address)
        task = TaskView(task_id=tid, origin=r["origin"], created_at=r["created_at"], last_activity=r["last"],
                        label="", agents=[])
        for address in names:
            agent = AgentView(address)
            for s in sessions.get((tid, address), []):
                key = s["session_key"]
                agent.sessions.append(SessionView(
                    session_key=key, task_id=tid, agent=address, source=s["source"], created_at=s["created_at"],
                    items=items.get(key, 0), responses=responses.get(key, 0), windows=windows.get(key, []),
                    other_branches=archived.get(key, 0), events=events.get(key, {}),
                    bridged_rounds=bridged[key].rounds if key in bridged else 0,
                    bridged_calls=bridged[key].calls if key in bridged else 0))
            task.agents.append(agent)
        agent_names = ", ".join(a.address for a in task.agents) or "no agents yet"
        first = labels.get(tid)
        task.label = f"{first!r} ({agent_names})" if first else agent_names
        out.append(task)
    return out


def find_session(conn: sqlite3.Connection, key: str) -> SessionView | None:
    row = conn.execute("SELECT task_id FROM journal_sessions WHERE session_key = ?", (key,)).fetchone()
    if row is None:
        return None
    for task in list_tasks(conn, task_id=row[0]):
        for agent in task.agents:
            for s in agent.sessions:
                if s.session_key == key:
                    return s
    return None


def session_items(conn: sqlite3.Connection, key: str, limit: int | None = None) -> list[ItemView]:
    sql = ("SELECT seq, item_id, window_id, origin, type, role, tool_name, text, created_at FROM journal_items "
           "WHERE session_key = ? ORDER BY seq")
    rows = conn.execute(sql, (key,)).fetchall()
    if limit is not None:
        rows = rows[-limit:]
    return [ItemView(seq=r["seq"], item_id=r["item_id"], window_id=r["window_id"], origin=r["origin"],
                     type=r["type"], role=r["role"], name=r["tool_name"], preview=_clip(r["text"] or ""),
                     created_at=r["created_at"]) for r in rows]


def item_raw(conn: sqlite3.Connection, item_id: str) -> tuple[ItemView, Any] | None:
    """One item with its JSON as first seen."""
    r = conn.execute("SELECT i.*, r.raw FROM journal_items i LEFT JOIN journal_raw r ON r.seq = i.seq "
                     "WHERE i.item_id = ?", (item_id,)).fetchone()
    if r is None:
        return None
    view = ItemView(seq=r["seq"], item_id=r["item_id"], window_id=r["window_id"], origin=r["origin"],
                    type=r["type"], role=r["role"], name=r["tool_name"], preview=_clip(r["text"] or ""),
                    created_at=r["created_at"])
    try:
        raw = orjson.loads(r["raw"]) if r["raw"] is not None else None
    except orjson.JSONDecodeError:
        raw = None
    return view, raw


def session_plot(conn: sqlite3.Connection, key: str, config: Config) -> SessionPlot:
    """Input tokens per answered request against the window, the compaction lines, and markers for every
    window after the first (whatever its strategy) and the compaction events."""
    points: list[PlotPoint] = []
    model = None
    for r in conn.execute("SELECT r.created_at, r.model, r.usage, i.window_id FROM journal_responses r LEFT JOIN "
                          "journal_items i ON i.item_id = r.tail_item_id WHERE r.session_key = ? "
                          "ORDER BY r.created_at", (key,)):
        try:
            usage = orjson.loads(r["usage"]) if r["usage"] else None
        except orjson.JSONDecodeError:
            usage = None
        if not isinstance(usage, dict) or not isinstance(usage.get("input_tokens"), int):
            continue
        model = r["model"] or model
        points.append(PlotPoint(at=r["created_at"], input_tokens=usage["input_tokens"],
                                output_tokens=int(usage.get("output_tokens") or 0), model=r["model"],
                                window_id=r["window_id"]))
    windows = _windows(conn, [key]).get(key, [])
    markers = [PlotMarker(at=w.created_at, kind="window", label=f"{w.window_id} {w.strategy}")
               for w in windows[1:]]  # every window after the session's first: rollovers, compactions, …
    if _has_table(conn, "compaction_events"):
        for r in conn.execute("SELECT at, kind, outcome FROM compaction_events WHERE session_key = ? ORDER BY at",
                              (key,)):
            markers.append(PlotMarker(at=r["at"], kind="compaction", label=f"{r['kind']} {r['outcome']}"))
    markers.sort(key=lambda m: m.at)
    learned = None
    if model and _has_table(conn, "compaction_windows"):
        learned = compaction_store.learned_window(conn, model)
    window = budget.effective_window(model, config.model_windows, learned)  # the one window (defect 4)
    lines: list[PlotLine] = []
    if window:
        rc = config.remote_compaction
        if rc.enabled:
            lines.append(PlotLine("compaction threshold", int(window * rc.threshold)))
        if config.recovers_overflow():
            lines.append(PlotLine("hold for overflow recovery", int(window * HOLD_FRACTION)))
        ctx = config.context
        if ctx.enabled:
            for name, label in (("reminder_ratio", "reminder"), ("hard_ratio", "hard trigger")):
                value = getattr(ctx, name, None)  # the context-windows settings (issue 13)
                if isinstance(value, float) and 0 < value <= 1:
                    lines.append(PlotLine(label, int(window * value)))
    return SessionPlot(session_key=key, window=window, points=points, markers=markers, lines=lines)


def resolve(conn: sqlite3.Connection, ref: str) -> tuple[str, str] | None:
    """('session', key) or ('task', id) for a session key, a task id, or a unique prefix of either."""
    for kind, table, col in (("session", "journal_sessions", "session_key"), ("task", "journal_tasks", "task_id")):
        if conn.execute(f"SELECT 1 FROM {table} WHERE {col} = ?", (ref,)).fetchone():
            return kind, ref
    found: list[tuple[str, str]] = []
    for kind, table, col in (("session", "journal_sessions", "session_key"), ("task", "journal_tasks", "task_id")):
        found += [(kind, r[0]) for r in conn.execute(
            f"SELECT {col} FROM {table} WHERE substr({col}, 1, ?) = ? LIMIT 2", (len(ref), ref))]
    return found[0] if len(found) == 1 else None


# ---- text for the CLI ---------------------------------------------------------------------------------


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def render_tasks(tasks: list[TaskView]) -> str:
    if not tasks:
        return "no tasks yet: they appear when requests pass through the proxy (or `ctproxy task new`)"
    out: list[str] = []
    for t in tasks:
        out.append(f"task {t.task_id}  {t.label}")
        out.append(f"  created {when(t.created_at)} by {t.origin}, last activity {when(t.last_activity)}; "
                   f"{t.sessions} session(s), {t.items} item(s)")
        for a in t.agents:
            out.append(f"  {a.address}  ({len(a.sessions)} session{'s' if len(a.sessions) != 1 else ''})")
            for s in a.sessions:
                wins = ", ".join(f"{w.window_id} {w.strategy} {w.items} items" for w in s.windows)
                compactions = sum(n for k, n in s.events.items() if "compaction" in k)
                recoveries = sum(n for k, n in s.events.items() if "recover" in k)
                out.append(f"    session {s.session_key} via {s.source or '?'}: windows [{wins}]")
                out.append(f"      items: {s.on_branch} on the current branch, {s.items} journaled, "
                           f"{s.other_branches} other branch(es); compactions {compactions}, recoveries {recoveries};"
                           f" {s.responses} answers" + (f"; bridged: {s.bridged_rounds} round(s), {s.bridged_calls} "
                                                       "call(s)" if s.bridged_calls else ""))
                others = {k: n for k, n in s.events.items() if "compaction" not in k and "recover" not in k}
                if others:
                    out.append("      events: " + ", ".join(f"{k} {n}" for k, n in sorted(others.items())))
    return "\n".join(out)


def render_session(s: SessionView, items: list[ItemView]) -> str:
    out = [f"session {s.session_key}  task {s.task_id}  agent {s.agent}  via {s.source or '?'}",
           f"  created {when(s.created_at)}; {s.items} items, {s.responses} answers", "  windows:"]
    for w in s.windows or []:
        out.append(f"    {w.window_id}  {w.strategy:<10} {w.items:>5} items  from {when(w.created_at)}"
                   f"  bootstrap: {w.bootstrap}" + (f"  ({w.reason})" if w.reason else ""))
    if not s.windows:
        out.append("    none")
    out.append("  items (seq, id, window, origin, role/type, preview):")
    for i in items:
        kind = f"{i.role}/{i.type}" if i.role else i.type
        if i.name:
            kind += f" {i.name}"
        out.append(f"    {i.seq:>6}  {i.item_id}  {i.window_id}  {i.origin:<6}  {kind:<28}  {i.preview}")
    if not items:
        out.append("    none")
    return "\n".join(out)


def render_item(view: ItemView, raw: Any) -> str:
    head = (f"item {view.item_id}  seq {view.seq}  window {view.window_id}  {view.origin}  "
            f"{view.role + '/' if view.role else ''}{view.type}  {when(view.created_at)}")
    body = orjson.dumps(raw, option=orjson.OPT_INDENT_2).decode() if raw is not None else "(raw JSON not kept)"
    return head + "\n" + body
