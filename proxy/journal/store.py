"""Applying journal operations to SQLite (runs on the writer thread, one transaction per batch).

Rendering the safe text, classifying roles/tools and resolving an output's call happen here, off
the request path. Every insert is idempotent (an item id is content-addressed), so replaying a
batch after a crash or a second process writing the same item is harmless.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence

import orjson

from proxy.items import classify
from proxy.items.canonical import item_type
from proxy.items.render import render_item
from proxy.journal.ops import (
    EnsureAgent,
    EnsureSession,
    EnsureTask,
    FileItems,
    Op,
    PutAlias,
    PutEvent,
    PutItem,
    PutItems,
    PutResponse,
    PutWindow,
    SetBranch,
)


def _dumps(value: object) -> str:
    return orjson.dumps(value).decode()


class BatchContext:
    """What one batch knows beyond the database: calls and items journaled earlier in the same batch,
    and branch appends not written yet."""

    def __init__(self, stamp: str | None = None) -> None:
        # Shared sessions (`ctproxy up --workers N`): the writer's id, stamped on every session this batch
        # changes (journal_session_stamps), and branch appends are merged with what another process wrote.
        self.stamp = stamp
        self.touched: set[str] = set()
        self.calls: dict[tuple[str, str], tuple[str | None, str | None]] = {}
        self.items = 0  # items inserted
        self.placed: dict[str, tuple[str, bool]] = {}  # item id → (window, hidden or control), this batch
        self._places: dict[tuple[str, bool], tuple[str, bool]] = {}  # each (window, hidden) once
        self.appends: dict[str, SetBranch] = {}  # session → its branch appends, merged (see set_branch)

    def place(self, item_id: str, window_id: str, hidden: bool) -> None:
        """Note where an item of this batch went. One tuple per (window, hidden), shared by the items: a batch of a
        100,000-item request held a tuple each for as long as its commit took (the writer's share of what a big
        request left in pymalloc's arenas, proxy/memory.py)."""
        where = (window_id, hidden)
        self.placed[item_id] = self._places.setdefault(where, where)


def _call_tool(conn: sqlite3.Connection, ctx: BatchContext, session_key: str,
               call_id: str) -> tuple[str | None, str | None] | None:
    hit = ctx.calls.get((session_key, call_id))
    if hit is not None:
        return hit
    row = conn.execute(
        "SELECT tool_namespace, tool_name FROM journal_items WHERE session_key=? AND call_id=?"
        " AND type IN ('function_call','custom_tool_call') ORDER BY seq LIMIT 1",
        (session_key, call_id),
    ).fetchone()
    return (row[0], row[1]) if row is not None else None


def put_item(conn: sqlite3.Connection, ctx: BatchContext, op: PutItem) -> bool:
    item = orjson.loads(op.raw)
    typ = item_type(item)
    call_id = classify.call_id_of(item)
    ns, name = classify.tool_of(item)
    if classify.is_output(item) and call_id:
        # An output belongs to its call: namespace and name come from the same call, never mixed.
        found = _call_tool(conn, ctx, op.session_key, call_id)
        if found is not None:
            ns, name = found
    elif typ in classify.CALL_TYPES and call_id:
        ctx.calls[(op.session_key, call_id)] = (ns, name)
    rendered = render_item(item)
    control, hidden = int(classify.is_control(item)), int(classify.is_hidden_tool(ns, name))
    upstream = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) else None
    cur = conn.execute(
        "INSERT OR IGNORE INTO journal_items(item_id, session_key, parent_id, window_id, origin, type, role,"
        " tool_namespace, tool_name, call_id, upstream_id, response_id, control, hidden, canon_hash, text,"
        " segments, chars, images, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (op.item_id, op.session_key, op.parent_id, op.window_id, op.origin, typ, classify.role_of(item),
         ns, name, call_id, upstream, op.response_id, control, hidden, op.canon, rendered.text,
         _dumps(rendered.segments), len(rendered.text), len(rendered.images), op.created_at),
    )
    if cur.rowcount != 1:
        return False
    conn.execute("INSERT INTO journal_raw(seq, raw) VALUES (?, ?)", (cur.lastrowid, op.raw))
    ctx.items += 1  # for the full-text index, added in bulk later (index_text)
    ctx.place(op.item_id, op.window_id, bool(control or hidden))
    return True


def _count(conn: sqlite3.Connection, session_key: str, rows: Iterable[sqlite3.Row | tuple], sign: int) -> None:
    for window_id, hidden, n in rows:
        visible_n, hidden_n = (0, n) if hidden else (n, 0)
        conn.execute(
            "INSERT INTO journal_window_counts(session_key, window_id, visible, hidden) VALUES (?,?,?,?)"
            " ON CONFLICT(session_key, window_id) DO UPDATE SET visible = visible + excluded.visible,"
            " hidden = hidden + excluded.hidden",
            (session_key, window_id, sign * visible_n, sign * hidden_n))


def set_branch(conn: sqlite3.Connection, ctx: BatchContext, op: SetBranch) -> None:
    """An append to a session's branch waits in the batch and merges with the next one (a request's items,
    then its answer's): one manifest write instead of two. Nothing in a batch reads the manifest, and
    a rewrite of the same session writes the waiting append first."""
    waiting = ctx.appends.get(op.session_key)
    if op.archived_head is None and waiting is not None and op.from_pos == waiting.from_pos + len(waiting.ids):
        ctx.appends[op.session_key] = waiting._replace(ids=waiting.ids + op.ids)
        return
    if waiting is not None:
        write_branch(conn, ctx, ctx.appends.pop(op.session_key))
    if op.archived_head is None:
        ctx.appends[op.session_key] = op
    else:
        write_branch(conn, ctx, op)


def flush_branches(conn: sqlite3.Connection, ctx: BatchContext) -> None:
    for op in ctx.appends.values():
        write_branch(conn, ctx, op)
    ctx.appends.clear()


def write_branch(conn: sqlite3.Connection, ctx: BatchContext, op: SetBranch) -> None:
    if ctx.stamp is not None:
        ctx.touched.add(op.session_key)
        if op.archived_head is None:
            merged = _merge_append(conn, op)
            if merged is None:
                return
            op = merged
    if op.archived_head is not None:
        conn.execute(
            "INSERT OR IGNORE INTO journal_branch_heads(session_key, head_item_id, length, reason, archived_at)"
            " VALUES (?,?,?,?,?)",
            (op.session_key, op.archived_head, op.archived_length, op.reason, time.time()),
        )
    removed = [r[0] for r in conn.execute("DELETE FROM journal_branch WHERE session_key=? AND pos>=?"
                                          " RETURNING item_id", (op.session_key, op.from_pos))]
    _count(conn, op.session_key, _groups(conn, ctx, removed, cached=False), -1)
    # Rows made as SQLite takes them: a 100,000-item branch as a list was as many tuples and ints at once.
    conn.executemany(
        "INSERT OR REPLACE INTO journal_branch(session_key, item_id, pos) VALUES (?,?,?)",
        ((op.session_key, item_id, op.from_pos + i) for i, item_id in enumerate(op.ids)),
    )
    _count(conn, op.session_key, _groups(conn, ctx, op.ids, cached=True), +1)


def _merge_append(conn: sqlite3.Connection, op: SetBranch) -> SetBranch | None:
    """An append when other processes write the same session: item ids are chained content hashes, so two
    workers journaling the same turn write the same ids at the same positions. What the manifest holds from
    `from_pos` on already (written by another worker, perhaps longer) is kept, not cut back to this append;
    an append that extends it writes only the rest; one that disagrees replaces it (the latest wins, as in
    one process). None: nothing to write."""
    existing = tuple(r[0] for r in conn.execute("SELECT item_id FROM journal_branch WHERE session_key=? AND pos>=?"
                                                " ORDER BY pos", (op.session_key, op.from_pos)))
    if not existing:
        return op
    if existing[:len(op.ids)] == op.ids:
        return None
    if op.ids[:len(existing)] == existing:
        return op._replace(from_pos=op.from_pos + len(existing), ids=op.ids[len(existing):])
    return op


def stamp_sessions(conn: sqlite3.Connection, ctx: BatchContext) -> None:
    """Shared sessions: each session this batch changed gets the writer's stamp (a process that cached the
    session reloads it when the stamp is another's, Journal._refresh)."""
    if ctx.stamp is None or not ctx.touched:
        return
    conn.executemany("INSERT INTO journal_session_stamps(session_key, writer, n) VALUES (?,?,1)"
                     " ON CONFLICT(session_key) DO UPDATE SET writer=excluded.writer, n=n+1",
                     [(key, ctx.stamp) for key in sorted(ctx.touched)])


def _groups(conn: sqlite3.Connection, ctx: BatchContext, ids: Sequence[str],
            cached: bool) -> list[tuple[str, bool, int]]:
    """(window, hidden or control, how many) of these items; from this batch's inserts when it has them all."""
    if cached and all(i in ctx.placed for i in ids):
        groups: dict[tuple[str, bool], int] = {}
        for i in ids:
            key = ctx.placed[i]
            groups[key] = groups.get(key, 0) + 1
        return [(w, h, n) for (w, h), n in groups.items()]
    out: list[tuple[str, bool, int]] = []
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        out += conn.execute("SELECT window_id, (hidden OR control), count(*) FROM journal_items"
                            f" WHERE item_id IN ({','.join('?' * len(chunk))}) GROUP BY 1, 2", chunk).fetchall()
    return out


def file_items(conn: sqlite3.Connection, ctx: BatchContext, op: FileItems) -> None:
    """Move items (on the branch) to another window, with the per-window counts."""
    flush_branches(conn, ctx)  # the branch's pending appends are counted where the items were first placed
    ids = list(op.item_ids)
    _count(conn, op.session_key, _groups(conn, ctx, ids, cached=False), -1)
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        conn.execute(f"UPDATE journal_items SET window_id=? WHERE item_id IN ({','.join('?' * len(chunk))})",
                     [op.window_id, *chunk])
    _count(conn, op.session_key, _groups(conn, ctx, ids, cached=False), +1)
    for item_id in ids:
        if item_id in ctx.placed:
            ctx.place(item_id, op.window_id, ctx.placed[item_id][1])


def apply_op(conn: sqlite3.Connection, ctx: BatchContext, op: Op) -> None:
    match op:
        case PutItem():
            put_item(conn, ctx, op)
        case PutItems():
            for one in op.each():
                put_item(conn, ctx, one)
        case SetBranch():
            set_branch(conn, ctx, op)
        case EnsureTask():
            conn.execute("INSERT OR IGNORE INTO journal_tasks(task_id, origin, created_at) VALUES (?,?,?)",
                         (op.task_id, op.origin, op.created_at))
        case EnsureAgent():
            conn.execute("INSERT OR IGNORE INTO journal_agents(task_id, address, created_at) VALUES (?,?,?)",
                         (op.task_id, op.address, op.created_at))
        case EnsureSession():
            conn.execute(
                "INSERT OR IGNORE INTO journal_sessions(session_key, task_id, address, source, created_at)"
                " VALUES (?,?,?,?,?)", (op.session_key, op.task_id, op.address, op.source, op.created_at))
        case PutWindow():
            if ctx.stamp is not None:
                ctx.touched.add(op.session_key)
            conn.execute(
                "INSERT OR IGNORE INTO journal_windows(task_id, address, window_id, ordinal, session_key,"
                " boundary_item_id, strategy, bootstrap, created_at, boundary_pos, boundary_hash, reason, opaque)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (op.task_id, op.address, op.window_id, op.ordinal, op.session_key, op.boundary_item_id,
                 op.strategy, _dumps(op.bootstrap), op.created_at, op.boundary_pos, op.boundary_hash, op.reason,
                 op.opaque))
        case PutResponse():
            conn.execute(
                "INSERT OR REPLACE INTO journal_responses(response_id, session_key, model, status, usage, error,"
                " tail_item_id, item_count, incomplete, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (op.response_id, op.session_key, op.model, op.status,
                 _dumps(op.usage) if op.usage is not None else None,
                 _dumps(op.error) if op.error is not None else None,
                 op.tail_item_id, op.item_count, int(op.incomplete), op.created_at))
        case PutAlias():
            conn.execute("INSERT OR REPLACE INTO journal_aliases(response_id, session_key, created_at)"
                         " VALUES (?,?,?)", (op.response_id, op.session_key, op.created_at))
        case FileItems():
            file_items(conn, ctx, op)
        case PutEvent():
            conn.execute("INSERT INTO journal_events(session_key, kind, detail, created_at) VALUES (?,?,?,?)",
                         (op.session_key, op.kind, _dumps(op.detail), op.created_at))


def apply_batch(conn: sqlite3.Connection, ops: Iterable[Op], between: Callable[[], None] | None = None,
                stamp: str | None = None) -> int:
    """Apply ops in one transaction. Returns how many items were inserted. `between` runs after each op.
    `stamp`: the writer's id when other processes write the same sessions (see BatchContext)."""
    ctx = BatchContext(stamp)
    conn.execute("BEGIN IMMEDIATE")
    try:
        for op in ops:
            apply_op(conn, ctx, op)
            if between is not None:
                between()
        flush_branches(conn, ctx)
        stamp_sessions(conn, ctx)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return ctx.items


def index_text(conn: sqlite3.Connection) -> int:
    """Add every item journaled since the last call (by any process) to the full-text index, in one
    transaction and one statement. Measured, indexing each turn's items in its own commit was about a
    third of the writer's SQLite time; a few hundred at once cost a fraction of that per item."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        (done,) = conn.execute("SELECT indexed_seq FROM journal_fts_state WHERE id = 0").fetchone()
        n = conn.execute("INSERT INTO journal_fts(rowid, text) SELECT seq, text FROM journal_items WHERE seq > ?"
                         " ORDER BY seq", (done,)).rowcount
        if n:
            conn.execute("UPDATE journal_fts_state SET indexed_seq = (SELECT max(seq) FROM journal_items)"
                         " WHERE id = 0")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return n
