"""Read side of the journal for the history tools: windows, items, one item, search.

Everything reads the current branch of the agent's sessions, in journal order (`seq`). Default
listings hide control messages and records of the recovery tools themselves; a tool filter brings
those tool records back. Search uses the FTS5 trigram index for queries of three or more code points
(and scans the few items the writer has not indexed yet) and verifies every candidate against the
text (segments: no match spans two parts); shorter queries scan the agent's items with `instr`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.items.classify import OWN_NAMESPACES, normalize_tool
from proxy.journal import schema as _schema  # noqa: F401  (registers the tables)
from proxy.journal.dialect import SQLITE, Dialect
from proxy.journal.excerpt import find_matches

# Items walk in journal order over the (session_key, seq) index; the branch check is a key lookup.
ON_BRANCH = ("EXISTS (SELECT 1 FROM journal_branch b WHERE b.session_key = i.session_key"
              " AND b.item_id = i.item_id)")
_INDEXED = "(SELECT indexed_seq FROM journal_fts_state WHERE id = 0)"
ITEM_COLS = ("i.seq, i.item_id, i.window_id, i.role, i.type, i.tool_namespace, i.tool_name, i.call_id,"
              " i.upstream_id, i.control, i.hidden, i.chars, i.images, i.created_at")
_FTS_COLS = ITEM_COLS.replace("i.seq,", "f.rowid AS seq,", 1)


@dataclass(frozen=True)
class ItemFilter:
    window_id: str | None = None
    role: str | None = None
    tool_namespace: str | None = None
    tool_name: str | None = None
    exclude_call_id: str | None = None  # the call being executed never finds itself
    # The name as given, when no namespace was: calls journaled before every road was filed under the
    # concept pair (a bridged call under its server label, `ctproxy`, `notes_write_file`) are found by a
    # bare name too, next to the concept pair (`notes`, `write_file`) every road is filed under now.
    as_given: str | None = None

    def normalized(self) -> ItemFilter:
        if self.tool_name is None:
            return self
        ns, name = self.tool_namespace, self.tool_name
        as_given = None
        if self.tool_name.startswith(("history_", "notes_")):
            ns2, name2 = normalize_tool(ns, name)
            if ns in (None, ns2, "functions", *OWN_NAMESPACES):
                if (ns is None or ns in OWN_NAMESPACES) and (ns2, name2) != (None, name):
                    as_given = name
                ns, name = ns2, name2
        return ItemFilter(self.window_id, self.role, ns, name, self.exclude_call_id, as_given)

    def sql(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if self.window_id is not None:
            clauses.append("i.window_id = ?")
            params.append(self.window_id)
        if self.role is not None:
            clauses.append("i.role = ?")
            params.append(self.role)
        if self.tool_namespace is None and self.tool_name is None:
            clauses.append("i.hidden = 0 AND i.control = 0")
        else:
            clauses.append("i.tool_name IS NOT NULL")
            pair: list[str] = []
            if self.tool_namespace is not None:
                pair.append("i.tool_namespace = ?")
                params.append(self.tool_namespace)
            if self.tool_name is not None:
                pair.append("i.tool_name = ?")
                params.append(self.tool_name)
            if self.as_given is not None:
                clauses.append(f"(({' AND '.join(pair)}) OR i.tool_name = ?)")
                params.append(self.as_given)
            else:
                clauses.extend(pair)
        if self.exclude_call_id is not None:
            clauses.append("(i.call_id IS NULL OR i.call_id != ?)")
            params.append(self.exclude_call_id)
        return " AND ".join(clauses), params


@dataclass(frozen=True)
class ItemRow:
    seq: int
    item_id: str
    window_id: str
    role: str | None
    type: str
    tool_namespace: str | None
    tool_name: str | None
    call_id: str | None
    upstream_id: str | None
    control: bool
    hidden: bool
    chars: int
    images: int
    created_at: float
    text: str = ""  # a preview or the full text, depending on the query
    segments: tuple[tuple[int, int], ...] = ()

    @property
    def tool(self) -> str | None:
        if self.tool_name is None:
            return None
        return f"{self.tool_namespace}.{self.tool_name}" if self.tool_namespace else self.tool_name


def item_row(r: Any, text: str = "", segments: Any = None) -> ItemRow:
    segs = tuple(tuple(s) for s in orjson.loads(segments)) if segments else ()
    return ItemRow(r["seq"], r["item_id"], r["window_id"], r["role"], r["type"], r["tool_namespace"],
                   r["tool_name"], r["call_id"], r["upstream_id"], bool(r["control"]), bool(r["hidden"]),
                   r["chars"], r["images"], r["created_at"], text, segs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class WindowInfo:
    window_id: str
    ordinal: int
    strategy: str
    items: int  # visible by default
    hidden_items: int  # control messages and recovery-tool records
    current: bool
    created_at: float


@dataclass(frozen=True)
class SearchHit:
    row: ItemRow
    matches: list[tuple[int, int]]


class HistoryReader:
    """The history tools' reads, written once in `?` placeholders over a store's dialect (SQLite's here, on one
    connection; PostgreSQL's in proxy/store/pg_journal.py, which brings its own search). Rows are read by column
    name."""

    def __init__(self, conn: sqlite3.Connection, dialect: Dialect = SQLITE):
        self.conn = conn
        self.dialect = dialect

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.conn.execute(self.dialect.sql(sql), params).fetchall()

    def agents(self, task_id: str) -> list[str]:
        return [r["address"] for r in self._all("SELECT address FROM journal_agents WHERE task_id=? ORDER BY address",
                                                (task_id,))]

    def agent_exists(self, task_id: str, address: str) -> bool:
        return bool(self._all("SELECT 1 AS x FROM journal_agents WHERE task_id=? AND address=?", (task_id, address)))

    def task_exists(self, task_id: str) -> bool:
        return bool(self._all("SELECT 1 AS x FROM journal_tasks WHERE task_id=?", (task_id,)))

    def sessions(self, task_id: str, address: str) -> list[str]:
        return [r["session_key"] for r in self._all(
            "SELECT session_key FROM journal_sessions WHERE task_id=? AND address=? ORDER BY created_at",
            (task_id, address))]

    def current_window(self, task_id: str, address: str) -> str | None:
        """The agent's newest window id, if the journal has one."""
        rows = self._all("SELECT window_id FROM journal_windows WHERE task_id=? AND address=?"
                         " ORDER BY created_at DESC, ordinal DESC LIMIT 1", (task_id, address))
        return rows[0]["window_id"] if rows else None

    def recent_calls(self, keys: list[str], types: tuple[str, ...], limit: int) -> list[tuple[str, bytes]]:
        """(call id, raw JSON) of the newest `limit` items of these sessions of these types with a call id."""
        in_keys, key_params = self.dialect.any_of("i.session_key", keys)
        in_types, type_params = self.dialect.any_of("i.type", types)
        return [(r["call_id"], bytes(r["raw"])) for r in self._all(
            "SELECT i.call_id, x.raw FROM journal_items i JOIN journal_raw x ON x.seq = i.seq"
            f" WHERE {in_keys} AND {in_types} AND i.call_id IS NOT NULL ORDER BY i.seq DESC LIMIT ?",
            [*key_params, *type_params, int(limit)])]

    def list_windows(self, task_id: str, address: str, limit: int, recent_first: bool) -> tuple[list[WindowInfo], int]:
        keys = self.sessions(task_id, address)
        if not keys:
            return [], 0
        in_keys, key_params = self.dialect.any_of("session_key", keys)
        counts = {r["window_id"]: (int(r["v"] or 0), int(r["h"] or 0)) for r in self._all(
            "SELECT window_id, sum(visible) AS v, sum(hidden) AS h FROM journal_window_counts"
            f" WHERE {in_keys} GROUP BY window_id", key_params)}
        rows = self._all(
            "SELECT w.*, (SELECT max(ordinal) FROM journal_windows x WHERE x.session_key = w.session_key) AS latest"
            " FROM journal_windows w WHERE w.task_id=? AND w.address=? ORDER BY w.ordinal"
            f" {'DESC' if recent_first else 'ASC'}", (task_id, address))
        out = [WindowInfo(r["window_id"], r["ordinal"], r["strategy"], *counts.get(r["window_id"], (0, 0)),
                          r["ordinal"] == r["latest"], r["created_at"]) for r in rows]
        return out[:limit], len(out)

    def list_items(self, task_id: str, address: str, flt: ItemFilter, limit: int, recent_first: bool,
                   preview_chars: int) -> tuple[list[ItemRow], bool]:
        """Up to `limit` items with a text preview of `preview_chars`; and whether more matched."""
        keys = self.sessions(task_id, address)
        if not keys:
            return [], False
        where, params = flt.normalized().sql()
        in_keys, key_params = self.dialect.any_of("i.session_key", keys)
        rows = self._all(
            f"SELECT {ITEM_COLS}, substr(i.text, 1, ?) AS preview FROM journal_items i"
            f" WHERE {in_keys} AND {ON_BRANCH} AND {where}"
            f" ORDER BY i.seq {'DESC' if recent_first else 'ASC'} LIMIT ?",
            [preview_chars + 1, *key_params, *params, limit + 1])
        return [item_row(r, r["preview"]) for r in rows[:limit]], len(rows) > limit

    def get_item(self, task_id: str, address: str, item_id: str) -> tuple[ItemRow, bytes, bool] | None:
        """The item (full text), its raw JSON, and whether it is on the current branch; only items of
        the agent's own sessions."""
        keys = self.sessions(task_id, address)
        if not keys:
            return None
        in_keys, key_params = self.dialect.any_of("i.session_key", keys)
        rows = self._all(
            f"SELECT {ITEM_COLS}, i.text, i.segments, (SELECT raw FROM journal_raw x WHERE x.seq = i.seq) AS raw,"
            f" {ON_BRANCH} AS on_branch FROM journal_items i WHERE i.item_id = ? AND {in_keys}",
            [item_id, *key_params])
        if not rows:
            return None
        r = rows[0]
        return item_row(r, r["text"], r["segments"]), bytes(r["raw"]), bool(r["on_branch"])

    @staticmethod
    def _in(keys: list[str]) -> str:
        return ",".join("?" * len(keys))

    def _candidates(self, keys: list[str], query: str, where: str, params: list[Any],
                    recent_first: bool) -> Iterator[sqlite3.Row]:
        order = "DESC" if recent_first else "ASC"
        if len(query) >= 3:
            # Indexed items through FTS, the few not indexed yet (see schema.py) by a scan; one statement,
            # so both halves read the same snapshot, merged in journal order.
            # CROSS JOIN and f.rowid keep the index driving the first half, in its own rowid order.
            phrase = '"' + query.replace('"', '""') + '"'
            sql = (f"SELECT {_FTS_COLS}, i.text, i.segments FROM journal_fts f"
                   " CROSS JOIN journal_items i ON i.seq = f.rowid"
                   " CROSS JOIN journal_branch b ON b.session_key = i.session_key AND b.item_id = i.item_id"
                   f" WHERE journal_fts MATCH ? AND i.session_key IN ({self._in(keys)}) AND {where}"
                   f" AND f.rowid <= {_INDEXED}"
                   f" UNION ALL SELECT {ITEM_COLS}, i.text, i.segments FROM journal_items i"
                   f" WHERE i.seq > {_INDEXED} AND i.session_key IN ({self._in(keys)}) AND instr(i.text, ?) > 0"
                   f" AND {ON_BRANCH} AND {where}"
                   f" ORDER BY 1 {order}")
            yield from self.conn.execute(sql, [phrase, *keys, *params, *keys, query, *params])
        else:
            sql = (f"SELECT {ITEM_COLS}, i.text, i.segments FROM journal_items i"
                   f" WHERE i.session_key IN ({self._in(keys)}) AND instr(i.text, ?) > 0 AND {ON_BRANCH}"
                   f" AND {where} ORDER BY i.seq {order}")
            yield from self.conn.execute(sql, [*keys, query, *params])

    def search(self, task_id: str, address: str, query: str, flt: ItemFilter, limit: int,
               recent_first: bool) -> tuple[list[SearchHit], bool]:
        """Items whose text contains `query` (literal, case-sensitive) inside one part; and whether
        more matched than `limit`."""
        keys = self.sessions(task_id, address)
        if not keys or not query:
            return [], False
        where, params = flt.normalized().sql()
        hits: list[SearchHit] = []
        for r in self._candidates(keys, query, where, params, recent_first):
            row = item_row(r, r["text"], r["segments"])
            matches = find_matches(row.text, row.segments, query)
            if not matches:
                continue
            if len(hits) == limit:
                return hits, True
            hits.append(SearchHit(row, matches))
        return hits, False


# The tool bridge's executed calls: `mcp_call` items with server label `ctproxy`, which the journal files under
# that namespace, or under the recovery tools' concept pair (history, notes; `functions` for the context tools:
# proxy/items/classify.normalize_tool). Another MCP server's calls carry their own label.
BRIDGE_NAMESPACES = ("ctproxy", "history", "notes", "functions")


@dataclass(frozen=True)
class BridgedCounts:
    """What the tool bridge ran in a session, from its answers' `mcp_call` items (ADR 0007)."""

    calls: int = 0  # calls ctproxy ran
    rounds: int = 0  # rounds of bridged calls: runs of consecutive calls within one answer
    answers: int = 0  # answers with at least one bridged call


def bridged_counts(conn: sqlite3.Connection, keys: list[str]) -> dict[str, BridgedCounts]:
    """Per session key. The merged answer keeps no round boundary, but one round's calls are adjacent
    (a round ends with its calls; the next starts with the model's reasoning or text), so a run of
    consecutive calls is one round; two rounds with nothing between them count as one. Only answers'
    items (`origin = 'output'`): an agent resending the calls does not count them again."""
    if not keys:
        return {}
    marks = ",".join("?" * len(keys))
    ours = ",".join("?" * len(BRIDGE_NAMESPACES))
    # (0/1, not booleans: the SQL both stores speak; proxy/store/pgview.py reads it on PostgreSQL)
    bridged = f"(CASE WHEN type = 'mcp_call' AND tool_namespace IN ({ours}) THEN 1 ELSE 0 END)"
    sql = ("SELECT session_key, sum(b), sum(CASE WHEN b = 1 AND coalesce(prev, 0) = 0 THEN 1 ELSE 0 END), "
           "count(DISTINCT CASE WHEN b = 1 THEN "
           f"response_id END) FROM (SELECT session_key, response_id, {bridged} "
           f"AS b, lag({bridged}) OVER (PARTITION BY session_key, response_id "
           f"ORDER BY seq) AS prev FROM journal_items WHERE origin = 'output' AND session_key IN ({marks})) q "
           "GROUP BY session_key HAVING sum(b) > 0")
    return {r[0]: BridgedCounts(int(r[1]), int(r[2]), int(r[3]))
            for r in conn.execute(sql, [*BRIDGE_NAMESPACES, *BRIDGE_NAMESPACES, *keys])}
