"""The journal on PostgreSQL: the `JournalBackend` of proxy/store/interface.py over proxy/store/postgres.py's tables.

The writes are the embedded journal's (proxy/journal/store.py), statement for statement, in PostgreSQL's words:
`INSERT … ON CONFLICT DO NOTHING` for `INSERT OR IGNORE`, `RETURNING seq` for `lastrowid`, `= ANY(array)` for
`IN (?, ?, …)`. Items get their `seq` from a sequence (migration 3), so two instances never collide on it; the order
of a session is its branch manifest (`journal_branch.pos`), not `seq`.

Several instances write the same sessions (a stateless conversation whose turns land on any of them), so:
- a batch takes a transaction-scoped advisory lock on each session whose branch or windows it changes, in one
  order (sorted keys): two batches on one session run one after the other, and the merge of a branch append
  with what another writer put there (ADR 0012) reads a manifest nobody else is changing;
- every session a batch changes gets the writer's stamp, and an instance that cached the session reloads it
  when the stamp is another's (`Journal.refresh`);
- a window is opened at once (`claim_window`): `INSERT … ON CONFLICT DO NOTHING` on its key (task, agent, window
  id, the id made from the ordinal), and when another instance took that ordinal, the next one; a new session is
  registered with its first window in one transaction (`create_session`), so whoever sees the session sees it.

Search: `text LIKE '%literal%'` (wildcards escaped), which the `pg_trgm` GIN index answers, and every candidate is
verified against the text and its segments (proxy/journal/excerpt.find_matches), as FTS5 candidates are.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson

from proxy.items import classify
from proxy.items.canonical import item_type
from proxy.items.render import render_item
from proxy.journal.model import Window, window_id
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
from proxy.journal.query import _ITEM_COLS, _ON_BRANCH, HistoryReader, ItemRow, WindowInfo, _row
from proxy.journal.sqlite_backend import window_from_row
from proxy.journal.store import BatchContext
from proxy.store.interface import StoreKind
from proxy.store.pgconn import connection as _connection


def _dumps(value: object) -> str:
    return orjson.dumps(value).decode()


def _session_lock_key(session_key: str) -> int:
    digest = hashlib.sha256(b"journal\x00" + session_key.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


WALK_ROWS = 1024  # history search: the first chunk of newest items walked (_candidates)
_WORDS = re.compile(r"[A-Za-z0-9]{3,}")  # the words of a literal pg_trgm looks up (three letters or digits or more)
_TRIGRAM_ROW_COST = 2.0  # a row the trigram bitmap rechecks, against a row walked (they read and test the same text)
_TRIGRAM_FIXED = 2000  # the trigram path's fixed cost in rows walked (its posting lists, a sort, a transaction)


def _like_any(word: str) -> str:
    return "%" + word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _prefer_trigram(hits: int, walked: int, cand: int, left: int, want: int = 64) -> bool:
    """After a chunk that did not fill a page: whether the trigram index is cheaper than walking on, from what the
    chunk showed. Walking on reads about `want / hit rate` more items (all `left` for a literal not seen); the
    trigram bitmap rechecks the rows that hold the literal's words (`cand / walked` of the `left` items)."""
    walk = left if hits == 0 else min(left, want * walked / hits)
    trigram = _TRIGRAM_FIXED + _TRIGRAM_ROW_COST * left * cand / walked
    return trigram < walk


def _dict_rows() -> Any:
    from psycopg.rows import dict_row

    return dict_row


# ------------------------------------------------------------------------------------------------ writes
def _call_tool(conn: Any, ctx: BatchContext, session_key: str, call_id: str) -> tuple[str | None, str | None] | None:
    hit = ctx.calls.get((session_key, call_id))
    if hit is not None:
        return hit
    row = conn.execute(
        "SELECT tool_namespace, tool_name FROM journal_items WHERE session_key=%s AND call_id=%s"
        " AND type IN ('function_call','custom_tool_call') ORDER BY seq LIMIT 1", (session_key, call_id)).fetchone()
    return (row[0], row[1]) if row is not None else None


def _put_item(conn: Any, ctx: BatchContext, op: PutItem) -> None:
    item = orjson.loads(op.raw)
    typ = item_type(item)
    call_id = classify.call_id_of(item)
    ns, name = classify.tool_of(item)
    if classify.is_output(item) and call_id:
        found = _call_tool(conn, ctx, op.session_key, call_id)
        if found is not None:
            ns, name = found
    elif typ in classify.CALL_TYPES and call_id:
        ctx.calls[(op.session_key, call_id)] = (ns, name)
    rendered = render_item(item)
    control, hidden = int(classify.is_control(item)), int(classify.is_hidden_tool(ns, name))
    upstream = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) else None
    # The item and its raw JSON in one statement (one round trip): the raw row only when the item was new.
    row = conn.execute(
        "WITH ins AS (INSERT INTO journal_items(item_id, session_key, parent_id, window_id, origin, type, role,"
        " tool_namespace, tool_name, call_id, upstream_id, response_id, control, hidden, canon_hash, text,"
        " segments, chars, images, created_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
        " ON CONFLICT (item_id) DO NOTHING RETURNING seq)"
        " INSERT INTO journal_raw(seq, raw) SELECT seq, %s FROM ins RETURNING seq",
        (op.item_id, op.session_key, op.parent_id, op.window_id, op.origin, typ, classify.role_of(item),
         ns, name, call_id, upstream, op.response_id, control, hidden, op.canon, rendered.text,
         _dumps(rendered.segments), len(rendered.text), len(rendered.images), op.created_at, op.raw)).fetchone()
    if row is None:
        return
    ctx.items += 1
    ctx.place(op.item_id, op.window_id, bool(control or hidden))


def _count(conn: Any, session_key: str, rows: Sequence[tuple[str, bool, int]], sign: int) -> None:
    for window, hidden, n in rows:
        visible_n, hidden_n = (0, n) if hidden else (n, 0)
        conn.execute(
            "INSERT INTO journal_window_counts(session_key, window_id, visible, hidden) VALUES (%s,%s,%s,%s)"
            " ON CONFLICT (session_key, window_id) DO UPDATE SET"
            " visible = journal_window_counts.visible + excluded.visible,"
            " hidden = journal_window_counts.hidden + excluded.hidden",
            (session_key, window, sign * visible_n, sign * hidden_n))


def _groups(conn: Any, ctx: BatchContext, ids: Sequence[str], cached: bool) -> list[tuple[str, bool, int]]:
    if cached and all(i in ctx.placed for i in ids):
        groups: dict[tuple[str, bool], int] = {}
        for i in ids:
            groups[ctx.placed[i]] = groups.get(ctx.placed[i], 0) + 1
        return [(w, h, n) for (w, h), n in groups.items()]
    if not ids:
        return []
    return [(r[0], bool(r[1]), int(r[2])) for r in conn.execute(
        "SELECT window_id, (hidden <> 0 OR control <> 0), count(*) FROM journal_items WHERE item_id = ANY(%s)"
        " GROUP BY 1, 2", (list(ids),))]


def _set_branch(conn: Any, ctx: BatchContext, op: SetBranch) -> None:
    waiting = ctx.appends.get(op.session_key)
    if op.archived_head is None and waiting is not None and op.from_pos == waiting.from_pos + len(waiting.ids):
        ctx.appends[op.session_key] = waiting._replace(ids=waiting.ids + op.ids)
        return
    if waiting is not None:
        _write_branch(conn, ctx, ctx.appends.pop(op.session_key))
    if op.archived_head is None:
        ctx.appends[op.session_key] = op
    else:
        _write_branch(conn, ctx, op)


def _flush_branches(conn: Any, ctx: BatchContext) -> None:
    for op in ctx.appends.values():
        _write_branch(conn, ctx, op)
    ctx.appends.clear()


def _merge_append(conn: Any, op: SetBranch) -> SetBranch | None:
    existing = tuple(r[0] for r in conn.execute(
        "SELECT item_id FROM journal_branch WHERE session_key=%s AND pos>=%s ORDER BY pos",
        (op.session_key, op.from_pos)))
    if not existing:
        return op
    if existing[:len(op.ids)] == op.ids:
        return None
    if op.ids[:len(existing)] == existing:
        return op._replace(from_pos=op.from_pos + len(existing), ids=op.ids[len(existing):])
    return op


def _write_branch(conn: Any, ctx: BatchContext, op: SetBranch) -> None:
    if ctx.stamp is not None:
        ctx.touched.add(op.session_key)
        if op.archived_head is None:
            merged = _merge_append(conn, op)
            if merged is None:
                return
            op = merged
    if op.archived_head is not None:
        conn.execute(
            "INSERT INTO journal_branch_heads(session_key, head_item_id, length, reason, archived_at)"
            " VALUES (%s,%s,%s,%s,extract(epoch from clock_timestamp())) ON CONFLICT DO NOTHING",
            (op.session_key, op.archived_head, op.archived_length, op.reason))
    removed = [r[0] for r in conn.execute("DELETE FROM journal_branch WHERE session_key=%s AND pos>=%s"
                                          " RETURNING item_id", (op.session_key, op.from_pos))]
    _count(conn, op.session_key, _groups(conn, ctx, removed, cached=False), -1)
    if op.ids:
        conn.execute(
            "INSERT INTO journal_branch(session_key, item_id, pos) SELECT %s, t.id, %s + t.n - 1"
            " FROM unnest(%s::text[]) WITH ORDINALITY AS t(id, n)"
            " ON CONFLICT (session_key, item_id) DO UPDATE SET pos = excluded.pos",
            (op.session_key, op.from_pos, list(op.ids)))
    _count(conn, op.session_key, _groups(conn, ctx, op.ids, cached=True), +1)


def _file_items(conn: Any, ctx: BatchContext, op: FileItems) -> None:
    _flush_branches(conn, ctx)
    ids = list(op.item_ids)
    _count(conn, op.session_key, _groups(conn, ctx, ids, cached=False), -1)
    conn.execute("UPDATE journal_items SET window_id=%s WHERE item_id = ANY(%s)", (op.window_id, ids))
    _count(conn, op.session_key, _groups(conn, ctx, ids, cached=False), +1)
    for item_id in ids:
        if item_id in ctx.placed:
            ctx.place(item_id, op.window_id, ctx.placed[item_id][1])


def _insert_window(conn: Any, op: PutWindow) -> bool:
    row = conn.execute(
        "INSERT INTO journal_windows(task_id, address, window_id, ordinal, session_key, boundary_item_id, strategy,"
        " bootstrap, created_at, boundary_pos, boundary_hash, reason, opaque)"
        " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING RETURNING 1",
        (op.task_id, op.address, op.window_id, op.ordinal, op.session_key, op.boundary_item_id, op.strategy,
         _dumps(op.bootstrap), op.created_at, op.boundary_pos, op.boundary_hash, op.reason, op.opaque)).fetchone()
    return row is not None


def _apply_op(conn: Any, ctx: BatchContext, op: Op) -> None:
    match op:
        case PutItem():
            _put_item(conn, ctx, op)
        case PutItems():
            for one in op.each():
                _put_item(conn, ctx, one)
        case SetBranch():
            _set_branch(conn, ctx, op)
        case EnsureTask():
            conn.execute("INSERT INTO journal_tasks(task_id, origin, created_at) VALUES (%s,%s,%s)"
                         " ON CONFLICT DO NOTHING", (op.task_id, op.origin, op.created_at))
        case EnsureAgent():
            conn.execute("INSERT INTO journal_agents(task_id, address, created_at) VALUES (%s,%s,%s)"
                         " ON CONFLICT DO NOTHING", (op.task_id, op.address, op.created_at))
        case EnsureSession():
            conn.execute("INSERT INTO journal_sessions(session_key, task_id, address, source, created_at)"
                         " VALUES (%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING",
                         (op.session_key, op.task_id, op.address, op.source, op.created_at))
        case PutWindow():
            if ctx.stamp is not None:
                ctx.touched.add(op.session_key)
            _insert_window(conn, op)
        case PutResponse():
            conn.execute(
                "INSERT INTO journal_responses(response_id, session_key, model, status, usage, error, tail_item_id,"
                " item_count, incomplete, created_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
                " ON CONFLICT (response_id) DO UPDATE SET session_key = excluded.session_key,"
                " model = excluded.model, status = excluded.status, usage = excluded.usage, error = excluded.error,"
                " tail_item_id = excluded.tail_item_id, item_count = excluded.item_count,"
                " incomplete = excluded.incomplete, created_at = excluded.created_at",
                (op.response_id, op.session_key, op.model, op.status,
                 _dumps(op.usage) if op.usage is not None else None,
                 _dumps(op.error) if op.error is not None else None,
                 op.tail_item_id, op.item_count, int(op.incomplete), op.created_at))
        case PutAlias():
            conn.execute("INSERT INTO journal_aliases(response_id, session_key, created_at) VALUES (%s,%s,%s)"
                         " ON CONFLICT (response_id) DO UPDATE SET session_key = excluded.session_key,"
                         " created_at = excluded.created_at", (op.response_id, op.session_key, op.created_at))
        case FileItems():
            _file_items(conn, ctx, op)
        case PutEvent():
            conn.execute("INSERT INTO journal_events(session_key, kind, detail, created_at) VALUES (%s,%s,%s,%s)",
                         (op.session_key, op.kind, _dumps(op.detail), op.created_at))


def _lock_sessions(conn: Any, keys: set[str]) -> None:
    """Transaction-scoped advisory locks on the sessions whose branch or windows this transaction changes, in one
    order (two batches on one session run one after the other; no two wait on each other crosswise)."""
    for key in sorted(keys):
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_session_lock_key(key),))


def _stamp(conn: Any, keys: set[str], stamp: str) -> None:
    for key in sorted(keys):
        conn.execute("INSERT INTO journal_session_stamps(session_key, writer, n) VALUES (%s,%s,1)"
                     " ON CONFLICT (session_key) DO UPDATE SET writer = excluded.writer,"
                     " n = journal_session_stamps.n + 1", (key, stamp))


def _claim(conn: Any, op: PutWindow, stamp: str | None,
           renamed: Callable[[PutWindow], PutWindow] | None = None) -> PutWindow:
    while not _insert_window(conn, op):
        op = op._replace(ordinal=op.ordinal + 1, window_id=window_id(op.ordinal + 1))
        if renamed is not None:
            op = renamed(op)  # a bootstrap that names its window's id names the id it gets
    if stamp is not None:
        _stamp(conn, {op.session_key}, stamp)
    return op


# ------------------------------------------------------------------------------------------------ reads
class PgHistoryReader(HistoryReader):
    """The history tools' reads (proxy/journal/query.HistoryReader) on PostgreSQL: the same rows, the same filters,
    search through the trigram index with every candidate verified (HistoryReader.search)."""

    def __init__(self, pool: Any):
        super().__init__(None)  # type: ignore[arg-type]
        self.pool = pool

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with _connection(self.pool) as conn, conn.cursor(row_factory=_dict_rows()) as cur:
            return cur.execute(sql, params).fetchall()

    def agents(self, task_id: str) -> list[str]:
        return [r["address"] for r in self._all("SELECT address FROM journal_agents WHERE task_id=%s"
                                                " ORDER BY address", (task_id,))]

    def agent_exists(self, task_id: str, address: str) -> bool:
        return bool(self._all("SELECT 1 AS x FROM journal_agents WHERE task_id=%s AND address=%s", (task_id, address)))

    def task_exists(self, task_id: str) -> bool:
        return bool(self._all("SELECT 1 AS x FROM journal_tasks WHERE task_id=%s", (task_id,)))

    def sessions(self, task_id: str, address: str) -> list[str]:
        return [r["session_key"] for r in self._all(
            "SELECT session_key FROM journal_sessions WHERE task_id=%s AND address=%s ORDER BY created_at",
            (task_id, address))]

    def current_window(self, task_id: str, address: str) -> str | None:
        rows = self._all("SELECT window_id FROM journal_windows WHERE task_id=%s AND address=%s"
                         " ORDER BY created_at DESC, ordinal DESC LIMIT 1", (task_id, address))
        return rows[0]["window_id"] if rows else None

    def recent_calls(self, keys: list[str], types: tuple[str, ...], limit: int) -> list[tuple[str, bytes]]:
        return [(r["call_id"], bytes(r["raw"])) for r in self._all(
            "SELECT i.call_id, x.raw FROM journal_items i JOIN journal_raw x ON x.seq = i.seq"
            " WHERE i.session_key = ANY(%s) AND i.type = ANY(%s) AND i.call_id IS NOT NULL"
            " ORDER BY i.seq DESC LIMIT %s", (keys, list(types), int(limit)))]

    def list_windows(self, task_id: str, address: str, limit: int, recent_first: bool) -> tuple[list[WindowInfo], int]:
        keys = self.sessions(task_id, address)
        if not keys:
            return [], 0
        counts = {r["window_id"]: (int(r["v"] or 0), int(r["h"] or 0)) for r in self._all(
            "SELECT window_id, sum(visible) AS v, sum(hidden) AS h FROM journal_window_counts"
            " WHERE session_key = ANY(%s) GROUP BY window_id", (keys,))}
        rows = self._all(
            "SELECT w.*, (SELECT max(ordinal) FROM journal_windows x WHERE x.session_key = w.session_key) AS latest"
            " FROM journal_windows w WHERE w.task_id=%s AND w.address=%s ORDER BY w.ordinal"
            f" {'DESC' if recent_first else 'ASC'}", (task_id, address))
        out = [WindowInfo(r["window_id"], r["ordinal"], r["strategy"], *counts.get(r["window_id"], (0, 0)),
                          r["ordinal"] == r["latest"], r["created_at"]) for r in rows]
        return out[:limit], len(out)

    @staticmethod
    def _where(flt: Any) -> tuple[str, list[Any]]:
        where, params = flt.normalized().sql()
        return where.replace("?", "%s"), params

    def list_items(self, task_id: str, address: str, flt: Any, limit: int, recent_first: bool,
                   preview_chars: int) -> tuple[list[ItemRow], bool]:
        keys = self.sessions(task_id, address)
        if not keys:
            return [], False
        where, params = self._where(flt)
        rows = self._all(
            f"SELECT {_ITEM_COLS}, substr(i.text, 1, %s) AS preview FROM journal_items i"
            f" WHERE i.session_key = ANY(%s) AND {_ON_BRANCH} AND {where}"
            f" ORDER BY i.seq {'DESC' if recent_first else 'ASC'} LIMIT %s",
            [preview_chars + 1, keys, *params, limit + 1])
        return [_row(r, r["preview"]) for r in rows[:limit]], len(rows) > limit

    def get_item(self, task_id: str, address: str, item_id: str) -> tuple[ItemRow, bytes, bool] | None:
        keys = self.sessions(task_id, address)
        if not keys:
            return None
        rows = self._all(
            f"SELECT {_ITEM_COLS}, i.text, i.segments, (SELECT raw FROM journal_raw x WHERE x.seq = i.seq) AS raw,"
            f" {_ON_BRANCH} AS on_branch FROM journal_items i WHERE i.item_id = %s AND i.session_key = ANY(%s)",
            [item_id, keys])
        if not rows:
            return None
        r = rows[0]
        return _row(r, r["text"], r["segments"]), bytes(r["raw"]), bool(r["on_branch"])

    def _candidates(self, keys: list[str], query: str, where: str, params: list[Any],
                    recent_first: bool) -> Iterator[Any]:
        # (`where` comes from HistoryReader.search, in SQLite's placeholders)
        # The caller verifies candidates as they come and stops at its limit. Which plan is cheap depends on how
        # often the literal occurs, which the planner cannot know (a LIKE '%…%' is estimated by its length alone):
        # walking the newest items finds a frequent literal in a page or two and reads every item for a rare one;
        # the trigram index finds a rare one at once, but its bitmap holds every row that has the literal's
        # trigrams, and rechecks them all, when its words are common. So the data decides (ADR 0013, "History
        # search"): walk the newest items in chunks (WALK_ROWS, growing), counting in each chunk the literal's
        # hits and the rows the trigram index would hand over (`_prefer_trigram`); continue by the trigram index
        # (its bitmap, the only plan allowed there) in keyset pages once that is the cheaper road.
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        where = where.replace("?", "%s")
        order, before = ("DESC", "<") if recent_first else ("ASC", ">")
        words = [w.lower() for w in _WORDS.findall(query)]
        if not words:  # nothing the trigram index could look up: walk, in keyset pages
            yield from self._pages(keys, pattern, where, params, order, before)
            return
        approx = [_like_any(w) for w in words]
        after, page, chunk = None, 64, WALK_ROWS
        while True:
            rows, walked, edge, cand, first = self._walk(keys, pattern, where, params, order, after, page, chunk,
                                                         approx)
            yield from rows
            if len(rows) == page:  # (the caller wants more: the walk goes on after the last one)
                after, page = rows[-1]["seq"], min(page * 4, 4096)
                continue
            if walked < chunk:
                return  # the walk read every item there is
            after = edge
            left = abs(edge - first) if first is not None else 0
            if _prefer_trigram(len(rows), walked, cand, left):
                break
            chunk = min(chunk * 4, 65536)
        cond = f"i.session_key = ANY(%s) AND i.text LIKE %s AND {_ON_BRANCH} AND {where}"
        page = 64
        while True:
            rows = self._trigram(
                f"WITH c AS MATERIALIZED (SELECT seq FROM journal_items WHERE text LIKE %s)"
                f" SELECT {_ITEM_COLS}, i.text, i.segments FROM c JOIN journal_items i ON i.seq = c.seq"
                f" WHERE {cond} AND i.seq {before} %s ORDER BY i.seq {order} LIMIT %s",
                [pattern, keys, pattern, *params, after, page])
            yield from rows
            if len(rows) < page:
                return
            after, page = rows[-1]["seq"], min(page * 4, 4096)

    def _pages(self, keys: list[str], pattern: str, where: str, params: list[Any], order: str,
               before: str) -> Iterator[Any]:
        """Matching items in journal order, a keyset page at a time, each after the last."""
        base = (f"SELECT {_ITEM_COLS}, i.text, i.segments FROM journal_items i"
                f" WHERE i.session_key = ANY(%s) AND i.text LIKE %s AND {_ON_BRANCH} AND {where}")
        after, page = None, 64
        while True:
            keyset = "" if after is None else f" AND i.seq {before} %s"
            rows = self._all(f"{base}{keyset} ORDER BY i.seq {order} LIMIT %s",
                             [keys, pattern, *params, *(() if after is None else (after,)), page])
            yield from rows
            if len(rows) < page:
                return
            after, page = rows[-1]["seq"], min(page * 4, 4096)

    def _walk(self, keys: list[str], pattern: str, where: str, params: list[Any], order: str, after: int | None,
              page: int, chunk: int, approx: list[str]) -> tuple[list[Any], int, int, int, int | None]:
        """The next `chunk` items of the sessions after `after`, newest (`DESC`) or oldest first, and the first `page`
        of them that match: (those rows in order, how many items were walked, the seq of the last one walked, how
        many of them hold every word of the literal in any case (what the trigram index would hand over), the seq
        of the sessions' last item that way). A full page is one query that stops at it; the chunk's figures are
        read only when the page is not full."""
        edge, before = ("min", "<") if order == "DESC" else ("max", ">")
        keyset = "" if after is None else f" AND i.seq {before} %s"
        walk = (f"SELECT * FROM journal_items i WHERE i.session_key = ANY(%s){keyset} ORDER BY i.seq {order}"
                f" LIMIT %s")
        walk_args = [keys, *(() if after is None else (after,)), chunk]
        rows = self._all(f"SELECT {_ITEM_COLS}, i.text, i.segments FROM ({walk}) i WHERE i.text LIKE %s"
                         f" AND {_ON_BRANCH} AND {where} ORDER BY i.seq {order} LIMIT %s",
                         [*walk_args, pattern, *params, page])
        if len(rows) == page:
            return rows, chunk, rows[-1]["seq"], 0, None
        cand = " AND ".join(["lower(i.text) LIKE %s"] * len(approx)) or "false"
        stats = self._all(
            f"SELECT count(*) AS walked, {edge}(i.seq) AS edge, count(*) FILTER (WHERE {cand}) AS cand,"
            f" (SELECT {edge}(x.seq) FROM journal_items x WHERE x.session_key = ANY(%s)) AS first FROM ({walk}) i",
            [*approx, keys, *walk_args])[0]
        return rows, int(stats["walked"]), stats["edge"], int(stats["cand"]), stats["first"]

    def _trigram(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """`sql` with the trigram index's bitmap as the only way to find the literal's rows (no sequential scan):
        one round trip (pipelined)."""
        with _connection(self.pool) as conn, conn.pipeline(), conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")
            with conn.cursor(row_factory=_dict_rows()) as cur:
                cur.execute(sql, params)
                return cur.fetchall()


class PgJournal:
    """The journal in a PostgreSQL database several instances share (`shared`, `claims_windows`)."""

    kind: StoreKind = "postgresql"
    shared = True
    claims_windows = True
    indexes_text = False  # the trigram index is kept by PostgreSQL itself

    def __init__(self, pool: Any):
        self.pool = pool
        self._history = PgHistoryReader(pool)

    def open(self) -> None:
        """The schema is brought up to date when the store opens (PostgresStore.open)."""

    def close(self) -> None:
        """The pool is the store's, closed with it."""

    def close_writer(self) -> None:
        """The writer's connections are the pool's."""

    def release_memory(self) -> None:
        """Nothing to free: the server caches the pages; psycopg keeps a query's buffers only while it runs."""

    def index_text(self) -> int:
        return 0

    def apply(self, ops: Sequence[Op], stamp: str | None = None) -> int:
        ctx = BatchContext(stamp)
        locked = {op.session_key for op in ops if isinstance(op, SetBranch | FileItems | PutWindow)}
        # Pipeline mode: the statements whose answers nothing reads go out without waiting for them (a turn's
        # batch is a handful of round trips, not one per statement).
        with _connection(self.pool) as conn, conn.pipeline(), conn.transaction():
            _lock_sessions(conn, locked)
            for op in ops:
                _apply_op(conn, ctx, op)
            _flush_branches(conn, ctx)
            if stamp is not None and ctx.touched:
                _stamp(conn, ctx.touched, stamp)
        return ctx.items

    def claim_window(self, op: PutWindow, stamp: str | None = None,
                     renamed: Callable[[PutWindow], PutWindow] | None = None) -> PutWindow:
        with _connection(self.pool) as conn, conn.transaction():
            _lock_sessions(conn, {op.session_key})
            return _claim(conn, op, stamp, renamed)

    def create_session(self, ops: Sequence[Op], window: PutWindow, stamp: str | None = None) -> PutWindow | None:
        *ensure, session = ops
        with _connection(self.pool) as conn, conn.transaction():
            _lock_sessions(conn, {window.session_key})
            ctx = BatchContext()
            for op in ensure:
                _apply_op(conn, ctx, op)
            row = conn.execute("INSERT INTO journal_sessions(session_key, task_id, address, source, created_at)"
                               " VALUES (%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING RETURNING 1",
                               (session.session_key, session.task_id, session.address, session.source,
                                session.created_at)).fetchone()
            return _claim(conn, window, stamp) if row is not None else None

    def _one(self, sql: str, params: Sequence[Any]) -> Any:
        with _connection(self.pool) as conn:
            return conn.execute(sql, params).fetchone()

    def _rows(self, sql: str, params: Sequence[Any]) -> list[Any]:
        with _connection(self.pool) as conn:
            return conn.execute(sql, params).fetchall()

    def create_task(self, task_id: str, origin: str, at: float) -> None:
        with _connection(self.pool) as conn:
            conn.execute("INSERT INTO journal_tasks(task_id, origin, created_at) VALUES (%s,%s,%s)",
                         (task_id, origin, at))

    def task_exists(self, task_id: str) -> bool:
        return self._one("SELECT 1 FROM journal_tasks WHERE task_id=%s", (task_id,)) is not None

    def agent_exists(self, task_id: str, address: str) -> bool:
        return self._one("SELECT 1 FROM journal_agents WHERE task_id=%s AND address=%s", (task_id, address)) is not None

    def stamp(self, session_key: str) -> tuple[str, int] | None:
        row = self._one("SELECT writer, n FROM journal_session_stamps WHERE session_key=%s", (session_key,))
        return (row[0], int(row[1])) if row is not None else None

    def session(self, session_key: str) -> tuple[str, str, str | None] | None:
        row = self._one("SELECT task_id, address, source FROM journal_sessions WHERE session_key=%s", (session_key,))
        return (row[0], row[1], row[2]) if row is not None else None

    def branch(self, session_key: str) -> list[tuple[str, str, str]]:
        return [(r[0], r[1], r[2]) for r in self._rows(
            "SELECT i.item_id, i.canon_hash, i.type FROM journal_branch b JOIN journal_items i"
            " ON i.item_id = b.item_id WHERE b.session_key=%s ORDER BY b.pos", (session_key,))]

    def _windows(self, sql: str, params: Sequence[Any]) -> list[Window]:
        with _connection(self.pool) as conn, conn.cursor(row_factory=_dict_rows()) as cur:
            return [window_from_row(r) for r in cur.execute(sql, params).fetchall()]

    def latest_window(self, session_key: str) -> Window | None:
        found = self._windows("SELECT * FROM journal_windows WHERE session_key=%s ORDER BY ordinal DESC LIMIT 1",
                              (session_key,))
        return found[0] if found else None

    def windows(self, session_key: str) -> list[Window]:
        return self._windows("SELECT * FROM journal_windows WHERE session_key=%s ORDER BY ordinal", (session_key,))

    def max_ordinal(self, task_id: str, address: str) -> int:
        row = self._one("SELECT max(ordinal) FROM journal_windows WHERE task_id=%s AND address=%s", (task_id, address))
        return int(row[0] or 0)

    def raw_items(self, item_ids: Sequence[str]) -> list[tuple[str, bytes]]:
        return [(r[0], bytes(r[1])) for r in self._rows(
            "SELECT i.item_id, r.raw FROM journal_items i JOIN journal_raw r ON r.seq = i.seq"
            " WHERE i.item_id = ANY(%s)", (list(item_ids),))]

    def call_items(self, session_key: str, call_ids: Sequence[str], types: Sequence[str]) -> list[tuple[str, bytes]]:
        return [(r[0], bytes(r[1])) for r in self._rows(
            "SELECT i.call_id, r.raw FROM journal_items i JOIN journal_raw r ON r.seq = i.seq"
            " WHERE i.session_key=%s AND i.call_id = ANY(%s) AND i.type = ANY(%s) ORDER BY i.seq",
            (session_key, list(call_ids), list(types)))]

    def session_for_response(self, response_id: str) -> str | None:
        row = self._one("SELECT session_key FROM journal_aliases WHERE response_id=%s", (response_id,))
        return row[0] if row is not None else None

    def sessions_for_responses(self, response_ids: Sequence[str]) -> dict[str, str]:
        rows = self._rows("SELECT response_id, session_key FROM journal_aliases WHERE response_id = ANY(%s)",
                          (list(response_ids),)) if response_ids else []
        return {r[0]: r[1] for r in rows}

    def response_tail(self, response_id: str) -> str | None:
        row = self._one("SELECT tail_item_id FROM journal_responses WHERE response_id=%s", (response_id,))
        return row[0] if row is not None else None

    def events(self, session_key: str) -> list[tuple[str, str, float]]:
        return [(r[0], r[1], float(r[2])) for r in self._rows(
            "SELECT kind, detail, created_at FROM journal_events WHERE session_key=%s ORDER BY id", (session_key,))]

    def history(self) -> PgHistoryReader:
        return self._history
