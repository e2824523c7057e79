"""Applying journal operations: the one writer, for every store (runs on the writer thread, one transaction per batch).

Each op's SQL is written here once, in `?` placeholders, and spoken in the store's words through its `Dialect`
(dialect.py: SQLite's, or PostgreSQL's in proxy/store/pg_journal.py). The transaction is the caller's (the store's
journal: `SqlJournal._writing`).

Rendering the safe text, classifying roles/tools and resolving an output's call happen here, off
the request path. Every insert is idempotent (an item id is content-addressed), so replaying a
batch after a crash or a second process writing the same item is harmless.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson

from proxy.items import classify
from proxy.items.canonical import item_type
from proxy.items.render import render_item
from proxy.journal.dialect import Dialect
from proxy.journal.model import window_id
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

ITEM_COLUMNS = ("item_id", "session_key", "parent_id", "window_id", "origin", "type", "role", "tool_namespace",
                "tool_name", "call_id", "upstream_id", "response_id", "control", "hidden", "canon_hash", "text",
                "segments", "chars", "images", "created_at")
WINDOW_COLUMNS = ("task_id", "address", "window_id", "ordinal", "session_key", "boundary_item_id", "strategy",
                  "bootstrap", "created_at", "boundary_pos", "boundary_hash", "reason", "opaque")
SESSION_COLUMNS = ("session_key", "task_id", "address", "source", "created_at")
RESPONSE_COLUMNS = ("response_id", "session_key", "model", "status", "usage", "error", "tail_item_id", "item_count",
                    "incomplete", "created_at")
_HEAD_COLUMNS = ("session_key", "head_item_id", "length", "reason", "archived_at")
_STAMP = ("INSERT INTO journal_session_stamps(session_key, writer, n) VALUES (?,?,1) ON CONFLICT (session_key)"
          " DO UPDATE SET writer = excluded.writer, n = journal_session_stamps.n + 1")
_COUNT = ("INSERT INTO journal_window_counts(session_key, window_id, visible, hidden) VALUES (?,?,?,?)"
          " ON CONFLICT (session_key, window_id) DO UPDATE SET"
          " visible = journal_window_counts.visible + excluded.visible,"
          " hidden = journal_window_counts.hidden + excluded.hidden")


def _dumps(value: object) -> str:
    return orjson.dumps(value).decode()


class BatchContext:
    """What one batch knows beyond the database: calls and items journaled earlier in the same batch,
    and branch appends not written yet."""

    def __init__(self, dialect: Dialect, stamp: str | None = None) -> None:
        self.d = dialect
        # Shared sessions (`ctproxy up --workers N`, or instances on one PostgreSQL database): the writer's id,
        # stamped on every session this batch changes (journal_session_stamps), and branch appends are merged with
        # what another writer wrote.
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


def _chunks(d: Dialect, ids: Sequence[str]) -> Iterable[Sequence[str]]:
    step = d.max_params or max(len(ids), 1)
    for i in range(0, len(ids), step):
        yield ids[i:i + step]


def _call_tool(conn: Any, ctx: BatchContext, session_key: str, call_id: str) -> tuple[str | None, str | None] | None:
    hit = ctx.calls.get((session_key, call_id))
    if hit is not None:
        return hit
    row = conn.execute(ctx.d.sql(
        "SELECT tool_namespace, tool_name FROM journal_items WHERE session_key=? AND call_id=?"
        " AND type IN ('function_call','custom_tool_call') ORDER BY seq LIMIT 1"), (session_key, call_id)).fetchone()
    return (row[0], row[1]) if row is not None else None


def put_item(conn: Any, ctx: BatchContext, op: PutItem) -> bool:
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
    values = (op.item_id, op.session_key, op.parent_id, op.window_id, op.origin, typ, classify.role_of(item),
              ns, name, call_id, upstream, op.response_id, control, hidden, op.canon, rendered.text,
              _dumps(rendered.segments), len(rendered.text), len(rendered.images), op.created_at)
    if not ctx.d.insert_item(conn, ITEM_COLUMNS, values, op.raw):
        return False
    ctx.items += 1  # for the full-text index, added in bulk later (index_text)
    ctx.place(op.item_id, op.window_id, bool(control or hidden))
    return True


def _count(conn: Any, ctx: BatchContext, session_key: str, rows: Iterable[tuple[str, bool, int]], sign: int) -> None:
    for window, hidden, n in rows:
        visible_n, hidden_n = (0, n) if hidden else (n, 0)
        conn.execute(ctx.d.sql(_COUNT), (session_key, window, sign * visible_n, sign * hidden_n))


def set_branch(conn: Any, ctx: BatchContext, op: SetBranch) -> None:
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


def flush_branches(conn: Any, ctx: BatchContext) -> None:
    for op in ctx.appends.values():
        write_branch(conn, ctx, op)
    ctx.appends.clear()


def write_branch(conn: Any, ctx: BatchContext, op: SetBranch) -> None:
    d = ctx.d
    if ctx.stamp is not None:
        ctx.touched.add(op.session_key)
        if op.archived_head is None:
            merged = _merge_append(conn, d, op)
            if merged is None:
                return
            op = merged
    if op.archived_head is not None:
        now, at = d.clock()
        conn.execute(d.sql(d.insert_ignore("journal_branch_heads", _HEAD_COLUMNS, f"?,?,?,?,{now}")),
                     (op.session_key, op.archived_head, op.archived_length, op.reason, *at))
    removed = [r[0] for r in conn.execute(d.sql("DELETE FROM journal_branch WHERE session_key=? AND pos>=?"
                                                " RETURNING item_id"), (op.session_key, op.from_pos))]
    _count(conn, ctx, op.session_key, _groups(conn, ctx, removed, cached=False), -1)
    if op.ids:
        d.put_positions(conn, op.session_key, op.from_pos, op.ids)
    _count(conn, ctx, op.session_key, _groups(conn, ctx, op.ids, cached=True), +1)


def _merge_append(conn: Any, d: Dialect, op: SetBranch) -> SetBranch | None:
    """An append when other writers write the same session: item ids are chained content hashes, so two
    writers journaling the same turn write the same ids at the same positions. What the manifest holds from
    `from_pos` on already (written by another writer, perhaps longer) is kept, not cut back to this append;
    an append that extends it writes only the rest; one that disagrees replaces it (the latest wins, as in
    one process). None: nothing to write."""
    existing = tuple(r[0] for r in conn.execute(d.sql("SELECT item_id FROM journal_branch WHERE session_key=?"
                                                      " AND pos>=? ORDER BY pos"), (op.session_key, op.from_pos)))
    if not existing:
        return op
    if existing[:len(op.ids)] == op.ids:
        return None
    if op.ids[:len(existing)] == existing:
        return op._replace(from_pos=op.from_pos + len(existing), ids=op.ids[len(existing):])
    return op


def stamp_sessions(conn: Any, d: Dialect, keys: Iterable[str], stamp: str) -> None:
    """Shared sessions: each session a batch changed gets the writer's stamp (a writer that cached the
    session reloads it when the stamp is another's, Journal.refresh)."""
    for key in sorted(keys):  # (a handful: the sessions of one batch)
        conn.execute(d.sql(_STAMP), (key, stamp))


def _groups(conn: Any, ctx: BatchContext, ids: Sequence[str], cached: bool) -> list[tuple[str, bool, int]]:
    """(window, hidden or control, how many) of these items; from this batch's inserts when it has them all."""
    if cached and all(i in ctx.placed for i in ids):
        groups: dict[tuple[str, bool], int] = {}
        for i in ids:
            key = ctx.placed[i]
            groups[key] = groups.get(key, 0) + 1
        return [(w, h, n) for (w, h), n in groups.items()]
    out: list[tuple[str, bool, int]] = []
    for chunk in _chunks(ctx.d, ids):
        cond, params = ctx.d.any_of("item_id", chunk)
        out += [(r[0], bool(r[1]), int(r[2])) for r in conn.execute(ctx.d.sql(
            f"SELECT window_id, (hidden <> 0 OR control <> 0), count(*) FROM journal_items WHERE {cond}"
            " GROUP BY 1, 2"), params)]
    return out


def file_items(conn: Any, ctx: BatchContext, op: FileItems) -> None:
    """Move items (on the branch) to another window, with the per-window counts."""
    flush_branches(conn, ctx)  # the branch's pending appends are counted where the items were first placed
    ids = list(op.item_ids)
    _count(conn, ctx, op.session_key, _groups(conn, ctx, ids, cached=False), -1)
    for chunk in _chunks(ctx.d, ids):
        cond, params = ctx.d.any_of("item_id", chunk)
        conn.execute(ctx.d.sql(f"UPDATE journal_items SET window_id=? WHERE {cond}"), [op.window_id, *params])
    _count(conn, ctx, op.session_key, _groups(conn, ctx, ids, cached=False), +1)
    for item_id in ids:
        if item_id in ctx.placed:
            ctx.place(item_id, op.window_id, ctx.placed[item_id][1])


def insert_window(conn: Any, d: Dialect, op: PutWindow) -> Any:
    """The window's row unless its key (task, agent, window id) is taken; the cursor (`rowcount`: 1 when inserted)."""
    return conn.execute(d.sql(d.insert_ignore("journal_windows", WINDOW_COLUMNS)),
                        (op.task_id, op.address, op.window_id, op.ordinal, op.session_key, op.boundary_item_id,
                         op.strategy, _dumps(op.bootstrap), op.created_at, op.boundary_pos, op.boundary_hash,
                         op.reason, op.opaque))


def insert_session(conn: Any, d: Dialect, op: EnsureSession) -> Any:
    return conn.execute(d.sql(d.insert_ignore("journal_sessions", SESSION_COLUMNS)),
                        (op.session_key, op.task_id, op.address, op.source, op.created_at))


def apply_op(conn: Any, ctx: BatchContext, op: Op) -> None:
    d = ctx.d
    match op:
        case PutItem():
            put_item(conn, ctx, op)
        case PutItems():
            for one in op.each():
                put_item(conn, ctx, one)
        case SetBranch():
            set_branch(conn, ctx, op)
        case EnsureTask():
            conn.execute(d.sql(d.insert_ignore("journal_tasks", ("task_id", "origin", "created_at"))),
                         (op.task_id, op.origin, op.created_at))
        case EnsureAgent():
            conn.execute(d.sql(d.insert_ignore("journal_agents", ("task_id", "address", "created_at"))),
                         (op.task_id, op.address, op.created_at))
        case EnsureSession():
            insert_session(conn, d, op)
        case PutWindow():
            if ctx.stamp is not None:
                ctx.touched.add(op.session_key)
            insert_window(conn, d, op)
        case PutResponse():
            conn.execute(d.sql(d.insert_replace("journal_responses", RESPONSE_COLUMNS, "response_id")),
                         (op.response_id, op.session_key, op.model, op.status,
                          _dumps(op.usage) if op.usage is not None else None,
                          _dumps(op.error) if op.error is not None else None,
                          op.tail_item_id, op.item_count, int(op.incomplete), op.created_at))
        case PutAlias():
            conn.execute(d.sql(d.insert_replace("journal_aliases", ("response_id", "session_key", "created_at"),
                                                "response_id")), (op.response_id, op.session_key, op.created_at))
        case FileItems():
            file_items(conn, ctx, op)
        case PutEvent():
            conn.execute(d.sql("INSERT INTO journal_events(session_key, kind, detail, created_at) VALUES (?,?,?,?)"),
                         (op.session_key, op.kind, _dumps(op.detail), op.created_at))


def locked_sessions(ops: Iterable[Op]) -> set[str]:
    """The sessions whose branch or windows these ops change (what a shared database locks for the batch)."""
    return {op.session_key for op in ops if isinstance(op, SetBranch | FileItems | PutWindow)}


def apply_ops(conn: Any, d: Dialect, ops: Iterable[Op], stamp: str | None = None,
              between: Callable[[], None] | None = None) -> int:
    """Apply ops inside the caller's transaction (its session locks taken). Returns how many items were inserted.
    `between` runs after each op. `stamp`: the writer's id when other writers write the same sessions."""
    ctx = BatchContext(d, stamp)
    for op in ops:
        apply_op(conn, ctx, op)
        if between is not None:
            between()
    flush_branches(conn, ctx)
    if stamp is not None and ctx.touched:
        stamp_sessions(conn, d, ctx.touched, stamp)
    return ctx.items


def claim(conn: Any, d: Dialect, op: PutWindow, stamp: str | None,
          renamed: Callable[[PutWindow], PutWindow] | None = None) -> PutWindow:
    """Open the window on its key, inside the caller's transaction; when another writer holds that ordinal, the next
    one (made again by `renamed`, when given). The window as opened."""
    while insert_window(conn, d, op).rowcount != 1:
        op = op._replace(ordinal=op.ordinal + 1, window_id=window_id(op.ordinal + 1))
        if renamed is not None:
            op = renamed(op)  # a bootstrap that names its window's id names the id it gets
    if stamp is not None:
        stamp_sessions(conn, d, (op.session_key,), stamp)
    return op


def register(conn: Any, d: Dialect, ops: Sequence[Op], window: PutWindow, stamp: str | None) -> PutWindow | None:
    """A session (its task and agent ops, then its EnsureSession last) with its first window, inside the caller's
    transaction; None when the session existed already (another writer registered it)."""
    *ensure, session = ops
    ctx = BatchContext(d)
    for op in ensure:
        apply_op(conn, ctx, op)
    assert isinstance(session, EnsureSession)
    return claim(conn, d, window, stamp) if insert_session(conn, d, session).rowcount == 1 else None
