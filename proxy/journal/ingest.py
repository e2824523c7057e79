"""The journal's request/answer path (the `Journal`'s ingest side; journal.py is the rest: sessions, windows, reads).

The proxy's request path (`begin_request`, `end_response`) only snapshots what passed and appends it to a backlog
(backlog.py); `settle` aligns it with the cached branch, hashes the new items and hands their writes to the writer
thread — on the writer's next drain, or first when anything reads a session. `ingest_request` / `ingest_response`
do the same at once (scripts, tests).

`JournalIngest` is a base of `Journal`, not a journal of its own: it works on the journal's state (the session
cache, the backlog, the writer), which `Journal.__init__` makes.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import fastsimdjson
import orjson

from proxy import memory
from proxy.items.canonical import (
    canonical_hash,
    chain_digest,
    chain_id,
    fingerprint,
    input_items,
    item_type,
    session_root,
)
from proxy.items.jsonbytes import dumps_kept
from proxy.items.lazyitems import LazyItems, as_list, plain
from proxy.journal.backlog import Pending, PendingRequest, PendingResponse, Prepared, RequestMark
from proxy.journal.branch import (
    Alignment,
    Branch,
    ColumnView,
    Entry,
    InputView,
    Resend,
    align,
    align_resend,
    align_stateful,
    resend_rest,
)
from proxy.journal.identity import auto_task_id
from proxy.journal.itemids import ItemIds
from proxy.journal.model import FILED_AFTER_KEY, SessionState, window_id
from proxy.journal.ops import Op, PutAlias, PutItem, PutItems, PutResponse, SetBranch
from proxy.journal.writer import JournalBackendLike, JournalWriter
from proxy.session import record_fingerprint_claim

log = logging.getLogger("ctproxy.journal")

CACHED_ALIASES = 20_000  # response ids (and their tails) this process keeps, here and in journal.py
RESEND_MAX_BYTES = 32 << 20
BACKLOG_MAX = 4096  # requests and answers waiting for the writer's next drain
# Inputs at least this big get their per-item work (parse, serialize, hash) done before the journal's lock
# is taken: a 100k-item input held it for seconds, and every other request waits for it (issue 10.3).
PREPARE_MIN_BYTES = 256 << 10
PUT_ITEMS_CHUNK = 512  # a big input's new items per write op (PutItems)


class JournalIngest:
    """The request/answer path of `Journal` (see the module's docstring). What it works on, made and kept by
    journal.py: the state below, and the journal's `_session`, `refresh`, `_new_window`, `_submit`, `_remember`,
    `record_event`, the session cache's `_set_entries`, `_resend_keep`, `_resend_drop`, `_bound_caches`,
    `_schedule_release`, `_position`."""

    backend: JournalBackendLike
    writer: JournalWriter
    shared: bool
    big_entries: int
    release_after: float
    _lock: threading.RLock
    _sessions: OrderedDict[str, SessionState]
    _resends: OrderedDict[str, tuple[int, Resend]]
    _aliases: OrderedDict[str, str]
    _tails: OrderedDict[str, str | None]
    _backlog: deque[Pending]
    _settling: bool
    _ring_due: bool
    _ring_due_at: float
    def begin_request(self, session_key: str, task_id: str, address: str, source: str | None,
                      payload: Mapping[str, Any], input_bytes: bytes | memoryview | None = None,
                      minted: bool = False) -> RequestMark:
        """The request path: snapshot the input and leave its alignment to the writer's next drain (or to
        the first reader of the session). The mark's ids and kind settle the backlog when read.
        `input_bytes`: the client's own bytes of the input list, when the caller has them (a big body): the
        resend prefix is compared on them, and the writer need not serialize the items again.
        `minted`: this request opened the session (`proxy.session.minted_for`), so nothing was recorded of it
        in any process: it is not looked up in the database, nor (a task of its own, `auto_task_id`) its
        agent's windows, nor its answer's claim (`end_response`)."""
        items = input_items(payload)
        st = self._sessions.get(session_key)  # cached: no need to wait for `_lock` (the writer may hold it)
        fresh = False
        if st is None:
            fresh = minted and task_id == auto_task_id(session_key)
            with self._lock:
                st = self._session(session_key, task_id, address, source, fresh=fresh)
        else:
            st.used_at = time.monotonic()
            if self.shared:
                self.refresh(st)
        mark = RequestMark(st.key, st.task_id, st.address, st, self.settle)
        mark.minted = fresh
        record_fingerprint_claim(self, st.key, st.source, items)  # issue 13 defect 5 (proxy/session.py)
        # The items themselves, serialized by the writer when it gets to them (`PendingRequest.serialized`):
        # every stage after this one makes new lists and dicts and never changes the client's (ADR 0006).
        whole = b"null" if items is None else input_bytes
        if isinstance(items, LazyItems):  # a big body's items, not built: the writer reads them from the bytes
            snapshot = None if input_bytes is not None else items.materialize()
        else:
            snapshot = list(items) if items is not None else None
        self._backlog.append(PendingRequest(mark, whole, _previous_response(payload), snapshot))
        self._after_append()
        return mark

    def end_response(self, mark: RequestMark, items: Sequence[dict[str, Any]], *, response_id: str | None,
                     model: str | None, status: str | None, usage: dict[str, Any] | None,
                     error: dict[str, Any] | None, incomplete: bool) -> None:
        """The answer's side of `begin_request`: its output items are snapshot and appended after the
        request's branch at the next drain; its response id resolves to the session at once."""
        if mark.response_done:
            return
        mark.response_done = True
        if mark.state is not None:
            mark.state.used_at = time.monotonic()
        snapshot = orjson.dumps(list(items))
        if response_id:  # a next request naming it (previous_response_id) finds its session at once
            self._remember(self._aliases, response_id, mark.session_key, CACHED_ALIASES)
        if mark.state is not None:  # issue 13 defect 5 (proxy/session.py)
            record_fingerprint_claim(self, mark.session_key, mark.state.source, items, opened=mark.minted)
        self._backlog.append(PendingResponse(mark, snapshot, None, response_id, model, status, usage, error,
                                             incomplete, time.time()))
        registered = mark.state.registered if mark.state is not None else None
        if registered is not None and not registered.is_set():
            # The answer ends only once the session's registration is committed (History.response): it is not
            # yet (a short stream ended before the writer's next drain), so that commit starts now, while the
            # answer's last bytes are passed on, rather than from the answer's end after a hop to a thread. The
            # drain takes everything pending, so a loop timer set earlier has nothing left to ring for.
            self._ring_due = False
            self.writer.ring()
            return
        self._after_append()

    def _after_append(self) -> None:
        if len(self._backlog) >= BACKLOG_MAX:
            # The writer is not keeping up (a stalled database): do the work here, where the writer's
            # bounded queue makes the request path wait, then drop, as it always did.
            self.settle()
        interval = self.writer.batch_interval
        if self._ring_due:
            if time.monotonic() - self._ring_due_at > 2 * interval:
                self._ring()  # the loop has not run its timer (it is blocked): ring now
            return  # a ring is scheduled: it takes this too
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.writer.wake_if_parked()  # no event loop here: the writer gathers for an interval itself
            return
        # On the proxy's event loop: ring the writer one interval from now, by a loop timer, so that it
        # does not wake (and take the GIL) while this exchange is being forwarded.
        self._ring_due, self._ring_due_at = True, time.monotonic()
        loop.call_later(interval, self._ring)

    def _ring(self) -> None:
        if self._ring_due:
            self._ring_due = False
            self.writer.ring()

    def ingest_request(self, st: SessionState, payload: Mapping[str, Any]) -> RequestMark:
        """Journal the input items not on the branch yet, now; the mark has every input item's id."""
        items = as_list(input_items(payload))
        if self.shared:
            self.refresh(st)
        with self._lock:
            mark = RequestMark(st.key, st.task_id, st.address, st, self.settle)
            self._backlog.append(PendingRequest(mark, dumps_kept(items), _previous_response(payload), items))
            self.settle()
        return mark

    def ingest_response(self, mark: RequestMark, items: Sequence[dict[str, Any]], *, response_id: str | None,
                        model: str | None, status: str | None, usage: dict[str, Any] | None,
                        error: dict[str, Any] | None, incomplete: bool) -> list[str]:
        """Journal a response's output items after its request's branch, now; once per request."""
        if mark.response_done:
            return []
        mark.response_done = True
        pending = PendingResponse(mark, None, list(items), response_id, model, status, usage, error, incomplete,
                                  time.time())
        with self._lock:
            self._backlog.append(pending)
            self.settle()
        return pending.ids or []

    def settle(self, wait: bool = True) -> None:
        """Journal everything the request path left for later, in order (every caller sees all of it
        done on return). Runs before anything reads a session, and on the writer thread before each
        drain with `wait=False`: while another thread holds the journal, the writer drains what it has
        rather than wait (that thread may itself be waiting for room in the writer's queue)."""
        while self._backlog:
            if not self._settling:
                self._prepare_next()
            if not self._lock.acquire(blocking=wait):
                return
            try:
                if self._settling or not self._backlog:
                    return  # called back from inside the work below: it is being done
                entry = self._backlog.popleft()
                self._settling = True
                try:
                    if isinstance(entry, PendingRequest):
                        self._align(entry)
                    else:
                        self._append_answer(entry)
                except Exception as exc:  # the journal is a record: one bad entry never blocks the rest
                    log.error("journal: %s not journaled (%s)", type(entry).__name__, type(exc).__name__)
                    if isinstance(entry, PendingRequest) and not entry.mark.settled:
                        st = entry.mark.state
                        entry.mark.fail(st.window.window_id if st is not None else "")
                finally:
                    self._settling = False
            finally:
                self._lock.release()
        if wait:
            # The backlog is empty, but another thread may have taken its last entry and be journaling it now,
            # under the lock: wait for that too, or the caller reads a mark not resolved yet (a request's ids,
            # under load). A call from inside that work holds the lock already.
            with self._lock:
                pass

    def _prepare_next(self) -> None:
        """The per-item work of the next big request in the backlog, without the journal's lock (pure work
        on its snapshot; at worst done twice or unused). Only the lock-held part of `_align` is left."""
        try:
            p = self._backlog[0]
        except IndexError:
            return
        if not isinstance(p, PendingRequest) or p.prepared is not None or len(p.serialized()) < PREPARE_MIN_BYTES:
            return
        st = p.mark.state
        if st is None or p.previous_response_id is not None:
            return
        resend = self._resends.get(st.key)
        rest = None
        if resend is not None and resend[0] == st.generation:
            rest = resend_rest(p.serialized(), resend[1], p.items)
        view: InputView | ColumnView
        if rest is None:
            # The whole input is aligned item by item: its per-item work goes to flat buffers, one item at a time
            # (ColumnView, proxy/journal/branch.py), not to a list of built items and their hashes.
            resend, view = None, _column_view(p)
        else:
            view = InputView(rest)
            hash_all = not st.entries  # all new: every item is hashed; else fingerprints decide most of them
            for k in range(len(view)):
                view.raw(k)
                if hash_all:
                    view.canon(k)
        p.prepared = Prepared(resend, len(resend[1].ids) if resend is not None else 0, view)

    def _align(self, p: PendingRequest) -> None:
        st = p.mark.state
        assert st is not None
        head = 0  # input items resolved at once by the byte prefix (the fast path)
        view: InputView | None = None
        if p.previous_response_id is not None:
            items = p.items if p.items is not None else orjson.loads(p.serialized())
            alignment = align_stateful(st.entries, items, self._tail_position(st, p.previous_response_id))
            rest = items
        else:
            alignment = None
            resend = self._resends.get(st.key)
            usable = resend is not None and resend[0] == st.generation
            prep = p.prepared
            if prep is not None and prep.resend is not None and not (usable and prep.resend is resend):
                prep = None  # prepared against a resend state that has moved on since: not used
            if prep is not None and prep.resend is not None:
                rest, view, head = prep.view.items, prep.view, prep.head
                alignment = align_resend(st.entries, rest, resend[1], view)
            elif prep is None and usable:
                rest = resend_rest(p.serialized(), resend[1], p.items)
                if rest is not None:
                    view, head = InputView(rest), len(resend[1].ids)
                    alignment = align_resend(st.entries, rest, resend[1], view)
            if alignment is None:
                head = 0
                if prep is not None and prep.resend is None:
                    rest, view = prep.view.items, prep.view
                else:
                    rest = p.items if p.items is not None else orjson.loads(p.serialized())
                    view = InputView(rest)
                alignment = align(st.entries, rest, view)
        if view is None or view.items is not rest:
            view = InputView(rest)  # the input items from `head` on
        n = head + len(rest)
        for j, fp in alignment.fp_updates:
            if j < len(st.entries):
                st.entries.set_fp(j, fp)
        if alignment.kind == "compaction":
            tip = st.entries.ids[-1] if st.entries else None
            st.window = self._new_window(st.key, st.task_id, st.address, tip, "client_compaction",
                                         {"reason": "the client sent a new compaction item"})
        new_entries, ops = self._new_items(st, alignment, view, head, "input", None)
        keep = alignment.keep
        branch = (st.entries + new_entries) if keep == len(st.entries) else st.entries[:keep] + new_entries
        ops_branch = self._branch_ops(st, branch, keep, alignment.kind)
        # The input's ids and positions: the matched items' from the old branch, then the new ones'. Columns, not
        # a string and an int object per item: a big input's are kept (Resend) for as long as its session is.
        old_from = alignment.new_from - head
        if len(new_entries) != n - alignment.new_from:
            raise ValueError("the new items do not follow the matched ones")
        rest_pos = array("q", [j if j is not None else -1 for j in alignment.matched[:old_from]])
        rest_ids = st.entries.ids.take(rest_pos) + new_entries.ids
        rest_pos.extend(range(keep, keep + len(new_entries)))
        ids = ItemIds.of(alignment.head_ids) + rest_ids
        if keep < len(st.entries):
            st.generation += 1
        self._set_entries(st, branch)
        if len(p.serialized()) <= RESEND_MAX_BYTES and p.previous_response_id is None:
            positions = array("q", alignment.head_positions)
            positions.extend(rest_pos)
            self._resend_keep(st.key, (st.generation, Resend(p.serialized(), ids, positions, len(branch))))
        else:
            self._resend_drop(st.key)
        self._submit(ops + ops_branch, p.queued_at)
        self._bound_caches(keep=st.key)
        memory.note_big_work(len(p.serialized()))  # a big input's objects are garbage soon: hand the pages back
        if alignment.kind in ("diverged", "prefix"):
            self.record_event(st.key, "branch", {"kind": alignment.kind, "kept": keep})
        p.mark.resolve(st.window.window_id, ids, alignment.kind, branch.ids[-1] if branch else None, branch)
        if len(branch) >= self.big_entries:
            self._schedule_release(self.release_after)

    def _new_items(self, st: SessionState, alignment: Alignment, view: InputView | ColumnView, head: int,
                   origin: str, response_id: str | None) -> tuple[Branch, list[Op]]:
        parent = st.entries.ids[alignment.keep - 1] if alignment.keep else session_root(st.key)
        now = time.time()
        first = alignment.new_from - head
        if isinstance(view, ColumnView):
            # A big input: its positions are made from the view's buffers, and its items written from them,
            # PUT_ITEMS_CHUNK to an op, rather than as an Entry, a PutItem and a JSON copy per item.
            first_parent = None if parent.startswith("root:") else parent
            packed = bytearray()  # the ids as 8 bytes each (proxy/journal/itemids.py): no string kept per item
            for k in range(first, len(view)):
                digest = chain_digest(parent, view.canon(k))
                packed += digest
                parent = "it_" + digest.hex()
            ids = ItemIds(bytes(packed))
            return view.branch(first, ids), _put_items(st.key, st.window.window_id, first_parent, ids, view, first,
                                                       origin, response_id, now)
        entries: list[Entry] = []
        ops: list[Op] = []
        for k in range(first, len(view)):
            canon = view.canon(k)
            item_id = chain_id(parent, canon)
            entries.append(Entry(item_id, canon, view.type(k), view.fp(k)))
            ops.append(PutItem(item_id, st.key, None if parent.startswith("root:") else parent,
                               st.window.window_id, origin, view.raw(k), canon, response_id, now))
            parent = item_id
        return Branch.of(entries), ops

    def _branch_ops(self, st: SessionState, branch: Branch, keep: int, reason: str) -> list[Op]:
        old = st.entries
        if keep >= len(old):
            if len(branch) == len(old):
                return []
            return [SetBranch(st.key, len(old), branch.ids[len(old):])]
        # The old branch stops being current from `keep` on: archive its head, rewrite the manifest.
        return [SetBranch(st.key, keep, branch.ids[keep:], old.ids[-1], len(old), reason)]

    def _tail_position(self, st: SessionState, response_id: str) -> int | None:
        tail = self._tails.get(response_id)
        if tail is None:
            tail = self.backend.response_tail(response_id)
        return self._position(st, tail) if tail else None

    def _append_answer(self, p: PendingResponse) -> None:
        mark = p.mark
        if mark.failed or not mark.settled:
            return  # its request is not on the branch; its items would hang from the wrong parent
        st = mark.state or self._session(mark.session_key)
        rid = p.response_id or "local_" + secrets.token_hex(8)
        items = p.items if p.items is not None else orjson.loads(p.snapshot or b"[]")
        base = mark.branch if mark.branch is not None else Branch()
        parent = base.ids[-1] if base else session_root(st.key)
        entries: list[Entry] = []
        ops: list[Op] = []
        # A window opened during this answer (a bridged mid-turn rollover): what came before it stays in the old one.
        w = st.window
        after = w.bootstrap.get(FILED_AFTER_KEY) if isinstance(w.bootstrap, dict) and w.ordinal > 1 else None
        filed_in = window_id(w.ordinal - 1) if isinstance(after, str) else w.window_id
        for item in items:
            raw = dumps_kept(item)  # held until written (proxy/items/jsonbytes.py)
            canon = canonical_hash(item)
            item_id = chain_id(parent, canon)
            # The fingerprint of the form received: a client resending it unchanged needs no hashing.
            entries.append(Entry(item_id, canon, item_type(item), fingerprint(raw)))
            ops.append(PutItem(item_id, st.key, None if parent.startswith("root:") else parent,
                               filed_in, "output", raw, canon, rid, p.created_at))
            if item_id == after:
                filed_in = w.window_id  # the items after it followed the new window's bootstrap
            parent = item_id
        if isinstance(after, str) and filed_in != w.window_id:  # not this answer's: all of it in the new window
            ops = [op._replace(window_id=w.window_id) if isinstance(op, PutItem) else op for op in ops]
        branch = base + entries
        if entries:
            keep = common_prefix(st.entries, base)
            if keep >= len(st.entries):
                ops.append(SetBranch(st.key, keep, branch.ids[keep:]))
            else:  # another request of this session moved the branch meanwhile: latest wins
                ops.append(SetBranch(st.key, keep, branch.ids[keep:], st.entries.ids[-1], len(st.entries),
                                     "concurrent"))
                st.generation += 1
            self._set_entries(st, branch)
        tail = branch.ids[-1] if branch else None
        ops.append(PutResponse(rid, st.key, p.model, p.status, p.usage, p.error, tail, len(entries), p.incomplete,
                               p.created_at))
        self._remember(self._tails, rid, tail, CACHED_ALIASES)
        if p.response_id:
            self._remember(self._aliases, p.response_id, st.key, CACHED_ALIASES)
            ops.append(PutAlias(p.response_id, st.key, p.created_at))
        self._submit(ops, p.queued_at)
        p.ids = [e.item_id for e in entries]



def _column_view(p: PendingRequest) -> ColumnView:
    """The ColumnView of a request's whole input: from its items when the request path kept them, else parsed
    lazily from its bytes (simdjson: the document is indexed, and each item is built only as it is reached)."""
    if p.items is not None:
        return ColumnView(p.items)
    whole = p.serialized()
    view = ColumnView(_each_item(whole))
    if len(whole) >= memory.BIG_BYTES:
        memory.release_parser()  # this thread's parser is sized for that document: let it go (it is gone)
    return view


def _each_item(whole: bytes) -> Iterator[Any]:
    doc = fastsimdjson.parse(whole)
    if not isinstance(doc, fastsimdjson.Array):
        raise TypeError("the input is not a list")
    for k in range(len(doc)):
        yield plain(doc[k])


def _put_items(session_key: str, window_id: str, parent: str | None, ids: ItemIds, view: ColumnView, first: int,
               origin: str, response_id: str | None, now: float) -> list[Op]:
    """The writes of new items `ids` (one after another; `parent`: the first one's, None at the session's root),
    whose JSON and canonical hashes are `view`'s from item `first` on: one PutItems op per PUT_ITEMS_CHUNK."""
    return [PutItems(session_key, parent if i == 0 else ids[i - 1], window_id, origin,
                     ids[i:i + PUT_ITEMS_CHUNK], view, first + i, response_id, now)
            for i in range(0, len(ids), PUT_ITEMS_CHUNK)]


def _previous_response(payload: Mapping[str, Any]) -> str | None:
    prev = payload.get("previous_response_id")
    return prev if isinstance(prev, str) and prev else None


def common_prefix(a: Branch, b: Branch) -> int:
    if a is b:
        return len(a)
    return a.ids.common_prefix(b.ids)


