"""Aligning a request's input with a session's current branch (pure).

Clients resend the whole conversation each turn. The aligner finds which input items are already
on the branch (they keep their ids) and which are new, and what the branch becomes:

- `continue`: the input walks the whole branch (output items a client may leave out, like
  reasoning, are skipped), then new items follow;
- `trimmed`: the client dropped an old prefix itself, the rest walks to the head;
- `prefix`: the input is an earlier point of the branch (a retry); new items branch from there;
- `compaction`: the client replaced its history with a new compaction item (its own compaction):
  everything is appended after the head, in a new window, so nothing earlier is lost;
- `diverged`: an edit; the branch is kept up to the last matching item of the longest matching run
  (from the start, or from where a trimmed input begins), the rest is new, and the old branch stays
  in the journal (its head is archived).
A stateful request (`previous_response_id`) appends its input after that response's last item.
`align_resend` is the fast path of the common case: the input begins, byte for byte, with the
previous request's input, so only the rest is compared item by item (same result, tested).
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.items.canonical import (
    COMPACTION_TYPES,
    SKIPPABLE_TYPES,
    canonical_digest,
    canonical_hash,
    fingerprint,
    item_type,
    type_name,
)
from proxy.items.jsonbytes import dumps_kept
from proxy.journal.itemids import ItemIds


@dataclass(slots=True)
class Entry:
    """One position of a branch as the aligner sees it (many live per session: slots keep them small)."""

    item_id: str
    canon: str
    type: str
    fp: int | None = None  # fingerprint of the form the client last sent

    @property
    def skippable(self) -> bool:
        return self.type in SKIPPABLE_TYPES


_FP_MASK = 0xFFFF_FFFF_FFFF_FFFF


def _digest(canon: str) -> bytes | None:
    """A canonical hash's 32 bytes; None for a string that is not one (64 lowercase hex digits)."""
    if len(canon) != 64:
        return None
    try:
        digest = bytes.fromhex(canon)
    except ValueError:
        return None
    return digest if digest.hex() == canon else None


class Branch:
    """A session's branch, position by position, in columns: the item ids (8 bytes each, proxy/journal/itemids.py), the
    canonical hashes as 32-byte digests one after another, the fingerprints in two arrays, the type names (shared).

    A cached 100,000-item session held an Entry, its canonical hash as text and its fingerprint as objects of
    their own per position (≈27 MB of small objects, alive together for as long as the session is cached, and
    freed together): pymalloc's arenas, where whatever else was allocated meanwhile stays (proxy/memory.py).
    Here a position costs ≈70 bytes in a few buffers. Reading a position gives an `Entry`
    made for the reader (a copy: `set_fp` changes a fingerprint); a slice or a sum is a new Branch."""

    __slots__ = ("_canons", "_fp_hash", "_fp_len", "_ids", "_odd", "_types")

    def __init__(self, ids: Iterable[str] | None = None, canons: bytes = b"", types: list[str] | None = None,
                 fp_len: array | None = None, fp_hash: array | None = None, odd: dict[int, str] | None = None):
        self._ids = ItemIds() if ids is None else ItemIds.of(ids)
        self._canons = canons  # 32 bytes a position
        self._types: list[str] = [] if types is None else types
        self._fp_len = array("q") if fp_len is None else fp_len  # the fingerprinted bytes' length; -1: none
        self._fp_hash = array("Q") if fp_hash is None else fp_hash
        self._odd = odd  # position → a canonical hash that is not a digest's hex (none is, in practice)

    @classmethod
    def of(cls, entries: Iterable[Entry]) -> Branch:
        ids: list[str] = []
        types: list[str] = []
        canons = bytearray()
        fp_len, fp_hash = array("q"), array("Q")
        odd: dict[int, str] | None = None
        for k, e in enumerate(entries):
            ids.append(e.item_id)
            types.append(type_name(e.type))
            digest = _digest(e.canon)
            if digest is None:
                odd = {} if odd is None else odd
                odd[k] = e.canon
                digest = bytes(32)
            canons += digest
            fp_len.append(-1 if e.fp is None else e.fp >> 64)
            fp_hash.append(0 if e.fp is None else e.fp & _FP_MASK)
        return cls(ids, bytes(canons), types, fp_len, fp_hash, odd)

    @property
    def ids(self) -> ItemIds:
        """The item ids, in order (a read-only column: proxy/journal/itemids.py)."""
        return self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __bool__(self) -> bool:
        return bool(self._ids)

    def item_id(self, k: int) -> str:
        return self._ids[k]

    def canon(self, k: int) -> str:
        if self._odd is not None and (odd := self._odd.get(k)) is not None:
            return odd
        return self._canons[32 * k:32 * k + 32].hex()

    def fp(self, k: int) -> int | None:
        n = self._fp_len[k]
        return None if n < 0 else n << 64 | self._fp_hash[k]

    def set_fp(self, k: int, fp: int) -> None:
        self._fp_len[k], self._fp_hash[k] = fp >> 64, fp & _FP_MASK

    def __getitem__(self, index: Any) -> Any:
        n = len(self._ids)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return [self[k] for k in range(start, stop, step)]
            stop = max(start, stop)
            odd = None
            if self._odd is not None:
                odd = {k - start: c for k, c in self._odd.items() if start <= k < stop} or None
            return Branch(self._ids[start:stop], self._canons[32 * start:32 * stop], self._types[start:stop],
                          self._fp_len[start:stop], self._fp_hash[start:stop], odd)
        k = operator.index(index)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError("branch position out of range")
        return Entry(self._ids[k], self.canon(k), self._types[k], self.fp(k))

    def __iter__(self) -> Iterator[Entry]:
        return (self[k] for k in range(len(self._ids)))

    def __add__(self, other: Any) -> Branch:
        if not isinstance(other, Branch):
            other = Branch.of(other)
        odd = None
        if self._odd is not None or other._odd is not None:
            n = len(self._ids)
            odd = {**(self._odd or {}), **{k + n: c for k, c in (other._odd or {}).items()}}
        return Branch(self._ids + other._ids, self._canons + other._canons, self._types + other._types,
                      self._fp_len + other._fp_len, self._fp_hash + other._fp_hash, odd)

    def __repr__(self) -> str:
        return f"<Branch of {len(self._ids)}>"


class InputView:
    """Lazily computed serializations, fingerprints and canonical hashes of the input items."""

    def __init__(self, items: Sequence[Any]):
        self.items = items
        self._raw: list[bytes | None] = [None] * len(items)
        self._canon: list[str | None] = [None] * len(items)

    def __len__(self) -> int:
        return len(self.items)

    def raw(self, k: int) -> bytes:
        v = self._raw[k]
        if v is None:
            v = self._raw[k] = dumps_kept(self.items[k])  # held until written (proxy/items/jsonbytes.py)
        return v

    def fp(self, k: int) -> int:
        return fingerprint(self.raw(k))

    def canon(self, k: int) -> str:
        v = self._canon[k]
        if v is None:
            v = self._canon[k] = canonical_hash(self.items[k])
        return v

    def type(self, k: int) -> str:
        return item_type(self.items[k])


class ColumnView:
    """What `InputView` works out of each item, for a big input, worked out once and kept in flat buffers.

    A 100,000-item request built 100,000 dicts, their strings, and a serialization, a hash and a fingerprint
    object per item, all alive together while the journal aligned and wrote it (≈70 MB of small objects).
    Small objects come from pymalloc's 1 MiB arenas, and an arena goes back to the OS only when every block in it
    is free: whatever else the process kept from that time (an answer's usage, a request record) stayed among
    them and kept the arenas (measured with bench_soak --only mem: ≈30 MB after idle, ≈1 MB with history off).
    Here each item is built, serialized and hashed one at a time and let go; what is kept is a few buffers
    (one allocation each, returned to the C allocator when they go): the items' JSON one after another, where
    each ends, the canonical digests, the fingerprints, and the type names (shared strings).

    The same questions as `InputView` (`raw`, `fp`, `canon`, `type`, `len`); `items` is the view itself (only
    its length is read through it)."""

    __slots__ = ("_blob", "_digests", "_ends", "_fps", "_types")

    def __init__(self, items: Iterable[Any]):
        blob, ends, digests, fps = bytearray(), array("Q"), bytearray(), array("Q")
        types: list[str] = []
        for item in items:
            raw = orjson.dumps(item)
            blob += raw
            ends.append(len(blob))
            fps.append(hash(raw) & 0xFFFF_FFFF_FFFF_FFFF)
            digests += canonical_digest(item)
            types.append(item_type(item))
        self._blob, self._ends, self._digests, self._fps, self._types = bytes(blob), ends, bytes(digests), fps, types

    @property
    def items(self) -> ColumnView:
        return self

    def __len__(self) -> int:
        return len(self._ends)

    def _span(self, k: int) -> tuple[int, int]:
        if k < 0:
            k += len(self._ends)
        return (self._ends[k - 1] if k > 0 else 0), self._ends[k]

    def raw(self, k: int) -> bytes:
        start, end = self._span(k)
        return self._blob[start:end]

    def fp(self, k: int) -> int:
        start, end = self._span(k)
        return (end - start) << 64 | self._fps[k]

    def canon(self, k: int) -> str:
        return self._digests[32 * k:32 * k + 32].hex()

    def type(self, k: int) -> str:
        return self._types[k]

    def branch(self, first: int, ids: ItemIds) -> Branch:
        """The branch positions of items `first`… (their ids chained by the caller), from the view's buffers."""
        n = len(self._ends)
        lengths = array("q", (end - start for start, end in map(self._span, range(first, n))))
        return Branch(ids, self._digests[32 * first:32 * n], self._types[first:], lengths, self._fps[first:])


@dataclass
class Alignment:
    kind: str  # continue | trimmed | prefix | compaction | diverged | stateful | new
    matched: list[int | None]  # per input item after the head: branch position it is, or None if new
    keep: int  # the new branch keeps entries[:keep]
    new_from: int  # input items from this index on are new
    fp_updates: list[tuple[int, int]] = field(default_factory=list)
    # The fast path resolves a head of input items at once (ids and positions, no per-item work).
    head_ids: Sequence[str] = ()
    head_positions: Sequence[int] = ()

    @property
    def changes_branch(self) -> bool:
        return self.kind in ("prefix", "diverged")


def _same(entry: Entry, view: InputView, k: int, fp_updates: list[tuple[int, int]], j: int) -> bool:
    fp = view.fp(k)
    if entry.fp is not None and entry.fp == fp:
        return True
    if entry.canon == view.canon(k):
        fp_updates.append((j, fp))  # remember the client's form for the fast path next turn
        return True
    return False


@dataclass
class _Walk:
    start: int
    matched: list[tuple[int, int]]  # (input index, branch position)
    end_j: int
    reached_end: bool
    consumed_all: bool
    fp_updates: list[tuple[int, int]]


def _walk(entries: Sequence[Entry], view: InputView, start: int, k0: int = 0) -> _Walk:
    n, m = len(entries), len(view)
    j, k = start, k0
    matched: list[tuple[int, int]] = []
    updates: list[tuple[int, int]] = []
    while k < m and j < n:
        if _same(entries[j], view, k, updates, j):
            matched.append((k, j))
            j += 1
            k += 1
        elif entries[j].skippable:
            j += 1
        else:
            break
    rest_skippable = all(e.skippable for e in entries[j:])
    return _Walk(start, matched, j, rest_skippable, k == m, updates)


def _result(kind: str, walk: _Walk, m: int, keep: int) -> Alignment:
    matched: list[int | None] = [None] * m
    for k, j in walk.matched:
        matched[k] = j
    return Alignment(kind, matched, keep, len(walk.matched), walk.fp_updates)


def align(entries: Sequence[Entry], items: Sequence[Any], view: InputView | None = None) -> Alignment:
    view = view or InputView(items)
    n, m = len(entries), len(view)
    if n == 0:
        return Alignment("new", [None] * m, 0, 0)
    first = _walk(entries, view, 0)
    if first.reached_end:
        return _result("continue", first, m, n)
    revised = _revised_instructions(entries, view, first)
    if revised is not None:
        return revised
    best = first
    if m:
        anchor = view.canon(0)
        for p in range(n - 1, 0, -1):
            if entries[p].canon != anchor:
                continue
            w = _walk(entries, view, p)
            if w.reached_end:
                return _result("trimmed", w, m, n)
            if len(w.matched) > len(best.matched):
                best = w  # the longest run wins (ties: the start at 0, then the latest anchor)
    tail_from = len(first.matched)
    known = {e.canon for e in entries}
    if any(view.type(k) in COMPACTION_TYPES and view.canon(k) not in known
           for k in range(tail_from, m)):
        return Alignment("compaction", [None] * m, n, 0, first.fp_updates)
    keep = best.matched[-1][1] + 1 if best.matched else 0
    return _result("prefix" if best.consumed_all and best.matched else "diverged", best, m, keep)


MAX_INSTRUCTIONS = 8  # leading instruction messages looked at for a revision


def _instruction(raw: bytes) -> bool:
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return (isinstance(item, dict) and item.get("type", "message") == "message"
            and item.get("role") in ("system", "developer"))


def _revised_instructions(entries: Sequence[Entry], view: InputView | ColumnView, first: _Walk) -> Alignment | None:
    """The agent changed its leading system/developer messages and nothing else (Pi rebuilds its system prompt
    with the date and its tool list): the same conversation continues the branch, so the items keep their ids
    and their windows (seed000-defects.md 3). The revised instructions take the old ones' positions (their ids,
    the journal's text of them stays the first one's). Only when the instructions alone differ: the walk after
    them reaches the branch's end, matching at least one conversation item."""
    if first.matched:
        return None
    lead = 0
    while lead < min(len(view), len(entries), MAX_INSTRUCTIONS) and view.type(lead) == "message" \
            and entries[lead].type == "message" and _instruction(view.raw(lead)):
        lead += 1
    if lead == 0 or lead >= len(view) or _instruction(view.raw(lead)):
        return None
    walk = _walk(entries, view, lead, lead)
    if not walk.reached_end or not walk.matched:
        return None
    walk.matched[:0] = [(k, k) for k in range(lead)]
    walk.fp_updates[:0] = [(k, view.fp(k)) for k in range(lead)]  # the revised form matches by bytes next time
    return _result("continue", walk, len(view), len(entries))


def align_stateful(entries: Sequence[Entry], items: Sequence[Any], after: int | None) -> Alignment:
    """`previous_response_id`: every input item is new, appended after branch position `after`
    (the previous response's last item; None = the head)."""
    n = len(entries)
    keep = n if after is None else after + 1
    kind = "stateful" if keep == n or all(e.skippable for e in entries[keep:]) else "diverged"
    if kind == "stateful":
        keep = n
    return Alignment(kind, [None] * len(items), keep, 0)


@dataclass(frozen=True)
class Resend:
    """A session's previous request, for the common case where the next input starts with it byte for
    byte (clients append to the conversation they resend): those items need no per-item comparison."""

    whole: bytes  # the previous input serialized (orjson); all but its closing ']' is the prefix
    ids: ItemIds  # the id of each of its items
    positions: Sequence[int]  # branch position of each of its items (an array: one allocation, not an int each)
    branch_len: int  # the branch's length right after that request


def resend_rest(whole: bytes, prev: Resend, items: Sequence[Any] | None = None) -> list[Any] | None:
    """The input items after the previous request's, when this input (`whole`, as orjson serializes it)
    begins with that one byte for byte; None when it does not. Only the rest is parsed (or sliced from
    `items` when given)."""
    n_prev, cut = len(prev.ids), len(prev.whole) - 1
    if not whole.startswith(memoryview(prev.whole)[:cut]):
        return None
    if n_prev == 0:
        return list(items) if items is not None else orjson.loads(whole)
    follows = whole[cut:cut + 1]
    if follows == b"]":
        return []
    if follows != b",":
        return None  # the previous last item is only a prefix of a longer one here
    if items is not None:
        return list(items[n_prev:])
    return orjson.loads(b"[" + whole[cut + 1:])


def align_resend(entries: Sequence[Entry], rest: Sequence[Any], prev: Resend,
                 view: InputView | None = None) -> Alignment | None:
    """Align an input that resends the previous one (`resend_rest` gave the items after it): only the rest
    is compared, against the branch after the previous request. None when the fast path does not apply
    (the caller aligns item by item)."""
    if prev.branch_len > len(entries):
        return None
    n_prev = len(prev.ids)
    rest_entries = entries[prev.branch_len:]
    if not rest:
        kind = "continue" if all(e.skippable for e in rest_entries) else "prefix"
        keep = len(entries) if kind == "continue" else prev.branch_len
        return Alignment(kind, [], keep, n_prev, [], prev.ids, prev.positions)
    sub = align(rest_entries, rest, view)
    if sub.kind not in ("continue", "new", "prefix", "diverged"):
        return None
    base = prev.branch_len
    return Alignment("continue" if sub.kind == "new" else sub.kind,
                     [None if j is None else base + j for j in sub.matched], base + sub.keep,
                     n_prev + sub.new_from, [(base + j, fp) for j, fp in sub.fp_updates], prev.ids, prev.positions)
