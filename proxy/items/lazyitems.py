"""The `input` list of a big request body, its items built only when a stage reads them (pure).

On a 1.5 MB body (bench b: 2,000 items) building the items as Python objects is most of what the proxy adds to a
request: ≈1.1 ms to parse and ≈1 ms to free them again, on the request path, while on an ordinary request of a
known session no stage needs more than the list's length, its first items, its last one and two facts of every
item (which types and roles it holds). `proxy/host/flowbody.py` therefore parses a big body with simdjson's lazy
parser (`fastsimdjson.parse`, ≈0.25 ms: the document is validated and indexed, nothing is built) and hands the
stages a `LazyItems` over its `input` array. Reading an item builds that item (once; the same dict every time);
`materialize()` builds the whole list (once), for the stages that rewrite the history.

`LazyItems` is a `Sequence`, not a `list`, on purpose: code that has not been shown to read it lazily says so
loudly (a JSON writer refuses it, `isinstance(x, list)` is False) instead of reading an empty list. The stages
that accept it are listed in `input_items`' callers; everything else gets the list (`ResponsesBody.value`).

Two readings differ from building the items (`as_dict`, like `json.loads`) in one case no JSON spec defines, an
item that carries the same key twice: a lookup on the view (`type_summary`) sees the first value, the built
item the last. RFC 8259 §4 leaves such objects' meaning to the implementation; the facts are read from the view.
"""

from __future__ import annotations

import asyncio
import operator
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any

import fastsimdjson

_SUMMARY_CHUNK = 4096  # items whose views `type_summary` reads at a time
_SLICE_BUILDS_ALL = 64  # a longer slice builds the whole list (one C call) instead of item by item


def plain(value: Any) -> Any:
    """A value of the lazy document as `fastsimdjson.loads` would have built it."""
    if isinstance(value, fastsimdjson.Object):
        return value.as_dict()
    if isinstance(value, fastsimdjson.Array):
        return value.as_list()
    return value


class LazyItems:
    """A read-only view of a JSON array of input items; see the module's docstring. A `Sequence` by registration,
    not by inheritance: `isinstance(x, LazyItems)`, asked of every input list by every stage, then runs in C
    (through an ABC it cost 0.3 µs a call); the mixins a Sequence would inherit are written out below."""

    # __weakref__: proxy/memory.note_big_parse learns when the document of a big body is gone
    __slots__ = ("__weakref__", "_all", "_array", "_built", "_n", "end", "source", "start")

    def __init__(self, array: fastsimdjson.Array, source: bytes, start: int, end: int):
        self._array: fastsimdjson.Array | None = array
        self._n = len(array)
        self._built: dict[int, Any] = {}
        self._all: list[Any] | None = None
        self.source, self.start, self.end = source, start, end  # the list's JSON text is source[start:end]

    @property
    def nbytes(self) -> int:
        """The client's bytes of the list (brackets included)."""
        return self.end - self.start

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __getitem__(self, index: Any) -> Any:  # type: ignore[override]
        if self._all is not None:
            return self._all[index]
        if isinstance(index, slice):
            ks = range(*index.indices(self._n))
            if len(ks) > _SLICE_BUILDS_ALL:
                return self.materialize()[index]
            return [self._item(k) for k in ks]
        k = operator.index(index)
        if k < 0:
            k += self._n
        if not 0 <= k < self._n:
            raise IndexError("input item index out of range")
        return self._item(k)

    def _item(self, k: int) -> Any:
        built = self._built.get(k)
        if built is None:
            assert self._array is not None
            built = self._built[k] = plain(self._array[k])
        return built

    def __iter__(self) -> Iterator[Any]:
        if self._all is not None:
            return iter(self._all)
        return (self._item(k) for k in range(self._n))  # a reader that stops early builds only what it read

    def scan(self) -> Iterator[Any]:
        """The items front to back, each built for the reader and not kept (an item read before is the one
        kept then). For a reader that may walk the whole list once (the session's claim looks for a call among a
        100,000-item input that has none): iterating keeps every item built for as long as the list lives, so a
        big input stood in pymalloc's arenas as 300,000 small objects all through the request, and whatever
        long-lived object was made meanwhile landed among them and kept their arenas after (proxy/memory.py)."""
        if self._all is not None:
            yield from self._all
            return
        array, built = self._array, self._built
        assert array is not None
        for k in range(self._n):
            item = built.get(k)
            yield plain(array[k]) if item is None else item

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyItems):
            return other is self or self.materialize() == other.materialize()
        if isinstance(other, list):
            return self.materialize() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # like a list

    # the Sequence mixins, as collections.abc writes them (reading items lazily, front to back or back to front)
    def __contains__(self, value: object) -> bool:
        return any(v is value or v == value for v in self)

    def __reversed__(self) -> Iterator[Any]:
        if self._all is not None:
            return reversed(self._all)
        return (self._item(k) for k in range(self._n - 1, -1, -1))

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        if self._all is not None:
            return self._all.index(value, start, stop if stop is not None else len(self._all))
        for k in range(*slice(start, stop).indices(self._n)):
            v = self._item(k)
            if v is value or v == value:
                return k
        raise ValueError(f"{value!r} is not in the input items")

    def count(self, value: Any) -> int:
        return sum(1 for v in self if v is value or v == value)

    def __add__(self, other: Any) -> list[Any]:
        return [*self, *other]

    def __radd__(self, other: Any) -> list[Any]:
        return [*other, *self]

    def __repr__(self) -> str:
        state = "built" if self._all is not None else f"{len(self._built)} built"
        return f"<LazyItems {self._n} items, {state}>"

    @property
    def materialized(self) -> list[Any] | None:
        """The whole list, if it has been built."""
        return self._all

    def materialize(self) -> list[Any]:
        """The whole list as `fastsimdjson.loads` builds it, built once; items read before are the same
        objects in it. The document is let go then (the list is all that is read from now on)."""
        if self._all is None:
            assert self._array is not None
            out = self._array.as_list()
            for k, item in self._built.items():
                out[k] = item
            self._all, self._built, self._array = out, {}, None
        return self._all

    def type_summary(self) -> tuple[frozenset[Any], tuple[int, ...]] | None:
        """The set of the items' `type`s and the positions of the items whose `role` is developer or system, read
        from the views without building the items: two C-level passes (≈0.2 ms for 2,000 items; 0.5 ms inside the
        proxy, where the document is cold). None when some item is no object (the caller walks the items then).
        A `type` or `role` that is itself an object or array is its view: equal to no string, as the built value
        would be.

        An agent resends its whole history with a few items more each time: when this list begins with the bytes
        of one read before (without its `]`, then `,` or `]`), those items are the same and so is their summary
        (`_SEEN`); only the items after them are read."""
        if self._array is None:
            return None
        seen = _SEEN.resent_by(self)
        skip = seen[0] if seen is not None else 0
        get = fastsimdjson.Object.get
        types: set[Any] = set()
        instructions: list[int] = []
        # In chunks: the whole list's views and roles at once were 200,000 small objects alive together for a
        # 100,000-item input (pymalloc's arenas, proxy/memory.py); a chunk's cost the same per item.
        for lo in range(skip, self._n, _SUMMARY_CHUNK):
            views = self._array[lo:lo + _SUMMARY_CHUNK]
            try:
                types.update(map(get, views, repeat("type")))
                roles = list(map(get, views, repeat("role")))
            except TypeError:  # an item that is no object
                return None
            instructions += [lo + k for k in positions_of(roles, ("developer", "system"))]
        plain = {type(t) for t in types} <= _PLAIN  # (a view would keep its document alive)
        if seen is not None:
            types |= seen[1]
            instructions = [*seen[2], *instructions]
        summary = (frozenset(types), tuple(instructions))
        if plain:
            _SEEN.remember(self, summary)
        return summary


def positions_of(values: list[Any], wanted: tuple[str, ...]) -> list[int]:
    """The sorted positions of `wanted` values in `values` (`list.index` runs in C)."""
    out: list[int] = []
    for value in wanted:
        k = -1
        for _ in range(values.count(value)):  # (counted first: a ValueError at the end costs more than a scan)
            k = values.index(value, k + 1)
            out.append(k)
    out.sort()
    return out


class _SeenLists:
    """The type summaries of the last big input lists read, by their first `KEY_BYTES` bytes (a conversation's
    start), for the next request of each conversation (`LazyItems.type_summary`). Bounded by entries and by the
    bytes it keeps alive (the bodies whose lists they are: the next list is compared with them byte for byte);
    only summaries whose types are all strings (or absent) are kept, so no document is held. Used from the event
    loop only. Inside the proxy on bench b (2,000 items): 0.4-0.5 ms for every item's type and role, 0.1 ms to
    find that a list resends one (one memcmp of 1.5 MB)."""

    KEY_BYTES = 256
    MAX_ENTRIES = 8
    MAX_BYTES = 32 << 20
    # A summary nobody asked for in this long is dropped with the body it keeps alive (issue 32, point 4: a
    # process that served big requests comes back to what it held before them once their sessions are idle).
    IDLE_SECONDS = 30.0

    def __init__(self) -> None:
        # key → (body, start, end, items, types, instruction positions)
        self._entries: OrderedDict[bytes, tuple[bytes, int, int, int, frozenset[Any], tuple[int, ...]]] = \
            OrderedDict()
        self._bytes = 0
        self._used: dict[bytes, float] = {}  # key → time.monotonic() it was last remembered or found
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_loop: asyncio.AbstractEventLoop | None = None

    def _key(self, items: LazyItems) -> bytes:
        return items.source[items.start:items.start + self.KEY_BYTES]

    def resent_by(self, items: LazyItems) -> tuple[int, frozenset[Any], tuple[int, ...]] | None:
        """(how many items of `items` were read before, their types, their instruction positions), or None."""
        key = self._key(items)
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._used[key] = time.monotonic()
        source, start, end, n, types, instructions = entry
        cut = end - 1 - start  # the earlier list's bytes without its `]`
        if not n or n > len(items) or items.nbytes <= cut:
            return None
        if not items.source.startswith(memoryview(source)[start:end - 1], items.start):
            return None
        follows = items.source[items.start + cut]
        if follows != 0x2C and not (follows == 0x5D and n == len(items)):  # ',' or the same list's ']'
            return None  # its last item is only the beginning of a longer one here
        return n, types, instructions

    def remember(self, items: LazyItems, summary: tuple[frozenset[Any], tuple[int, ...]]) -> None:
        """Keep `items`' summary (its types all strings or None) for the next request."""
        key = self._key(items)
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old[0])
        self._entries[key] = (items.source, items.start, items.end, len(items), *summary)
        self._used[key] = time.monotonic()
        self._bytes += len(items.source)
        while self._entries and (len(self._entries) > self.MAX_ENTRIES or self._bytes > self.MAX_BYTES):
            gone, dropped = self._entries.popitem(last=False)
            self._used.pop(gone, None)
            self._bytes -= len(dropped[0])
        self._schedule_expiry(self.IDLE_SECONDS)

    def _schedule_expiry(self, delay: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (scripts): bounded by MAX_ENTRIES and MAX_BYTES only
        if self._expiry is not None and self._expiry_loop is loop:
            return
        self._expiry_loop = loop  # (a handle of another, finished loop never fires: scheduled again here)
        self._expiry = loop.call_later(max(delay, 0.01), self._expire)

    def _expire(self) -> None:
        """Drop the summaries idle for IDLE_SECONDS; look again when the next one is due."""
        self._expiry = None
        now = time.monotonic()
        freed = 0
        for key in list(self._entries):
            if now - self._used.get(key, 0.0) >= self.IDLE_SECONDS:
                dropped = self._entries.pop(key)
                self._used.pop(key, None)
                self._bytes -= len(dropped[0])
                freed += len(dropped[0])
        if freed:
            from proxy import memory

            memory.note_big_work(freed)
        if self._entries:
            self._schedule_expiry(min(self.IDLE_SECONDS - (now - self._used.get(k, now)) for k in self._entries))

    def clear(self) -> None:
        self._entries.clear()
        self._used.clear()
        self._bytes = 0


Sequence.register(LazyItems)

_PLAIN = frozenset({str, type(None)})
_SEEN = _SeenLists()


def is_item_list(value: Any) -> bool:
    """An input list: a `list`, or a `LazyItems` not yet built."""
    return isinstance(value, (list, LazyItems))


def as_list(value: Any) -> Any:
    """`value` with a `LazyItems` built into its list; anything else as it is."""
    return value.materialize() if isinstance(value, LazyItems) else value


def plain_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` with its `input` built into a list, when it is a `LazyItems` (a new dict; else `payload`)."""
    inp = payload.get("input")
    return {**payload, "input": inp.materialize()} if isinstance(inp, LazyItems) else payload
