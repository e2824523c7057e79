"""Item ids in a column (pure): 8 bytes a position, not a string object each.

Every id the journal hands out is `it_` and 16 hex digits (proxy/items/canonical.chain_id), a 68-byte string
object of pymalloc's. A cached 100,000-item session held 100,000 of them, alive together from its big request
until the session was let go, and a big request's branch, its kept input (`Resend`), its mark and its ops shared
them: pymalloc's 1 MiB arenas go back to the OS only once every block in them is free, and the few long-lived
objects made meanwhile (a request record, a usage, a cache entry) stayed among the ids and kept ≈5 arenas after
idle (bench_soak --only mem, bench/memprobe.py). Here the ids are one `bytes` (the hex digits as bytes); reading a
position makes its string for the reader. An id of another form (none is made today; a store may hold one) is
kept as it is, by position (`odd`).

`ItemIds` is a read-only sequence of str: indexing, slicing (another `ItemIds`), iteration, `len`, `+` (with any
iterable of ids), `==` with any sequence of str.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

PREFIX = "it_"
_WIDTH = 8  # bytes a position: 16 hex digits
_HEX = frozenset("0123456789abcdef")


def _packed(item_id: str) -> bytes | None:
    """The 8 bytes of an `it_` + 16 lowercase hex digits id; None for any other string."""
    if len(item_id) != 19 or not item_id.startswith(PREFIX) or not _HEX.issuperset(item_id[3:]):
        return None
    return bytes.fromhex(item_id[3:])


class ItemIds:
    """See the module's docstring."""

    __slots__ = ("_bin", "_odd")

    def __init__(self, packed: bytes = b"", odd: dict[int, str] | None = None):
        self._bin = packed  # _WIDTH bytes a position (zeros where `odd` holds the id)
        self._odd = odd or None

    @classmethod
    def of(cls, ids: Iterable[str]) -> ItemIds:
        if isinstance(ids, ItemIds):
            return ids
        out = bytearray()
        odd: dict[int, str] = {}
        for k, item_id in enumerate(ids):
            packed = _packed(item_id)
            if packed is None:
                odd[k] = item_id
                packed = bytes(_WIDTH)
            out += packed
        return cls(bytes(out), odd)

    def __len__(self) -> int:
        return len(self._bin) // _WIDTH

    def __bool__(self) -> bool:
        return bool(self._bin)

    def _at(self, k: int) -> str:
        if self._odd is not None and (odd := self._odd.get(k)) is not None:
            return odd
        return PREFIX + self._bin[_WIDTH * k:_WIDTH * k + _WIDTH].hex()

    def __getitem__(self, index: Any) -> Any:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return ItemIds.of(self._at(k) for k in range(start, stop, step))
            stop = max(start, stop)
            odd = None
            if self._odd is not None:
                odd = {k - start: v for k, v in self._odd.items() if start <= k < stop}
            return ItemIds(self._bin[_WIDTH * start:_WIDTH * stop], odd)
        k = operator.index(index)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError("item id index out of range")
        return self._at(k)

    def __iter__(self) -> Iterator[str]:
        if self._odd is None:
            data = self._bin
            return (PREFIX + data[i:i + _WIDTH].hex() for i in range(0, len(data), _WIDTH))
        return (self._at(k) for k in range(len(self)))

    def __reversed__(self) -> Iterator[str]:
        return (self._at(k) for k in range(len(self) - 1, -1, -1))

    def __contains__(self, value: object) -> bool:
        return any(v == value for v in self)

    def last_index(self, item_id: str) -> int | None:
        """The last position of `item_id`; None when it is not here."""
        packed = _packed(item_id) if isinstance(item_id, str) else None
        if packed is None:
            found = [k for k, v in (self._odd or {}).items() if v == item_id]
            return max(found) if found else None
        data, end = self._bin, len(self._bin)
        while (at := data.rfind(packed, 0, end)) >= 0:
            if at % _WIDTH == 0 and (self._odd is None or at // _WIDTH not in self._odd):
                return at // _WIDTH
            end = at + _WIDTH - 1  # a match across two ids: look before its start
        return None

    def index(self, value: str) -> int:
        for k, v in enumerate(self):
            if v == value:
                return k
        raise ValueError(f"{value!r} is not among the item ids")

    def __add__(self, other: Iterable[str]) -> ItemIds:
        other = ItemIds.of(other)
        odd = None
        if self._odd is not None or other._odd is not None:
            n = len(self)
            odd = {**(self._odd or {}), **{k + n: v for k, v in (other._odd or {}).items()}}
        return ItemIds(self._bin + other._bin, odd)

    def __radd__(self, other: Iterable[str]) -> ItemIds:
        return ItemIds.of(other) + self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ItemIds):
            return self._bin == other._bin and (self._odd or {}) == (other._odd or {})
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # like a list

    def common_prefix(self, other: ItemIds) -> int:
        """How many ids from the start are the same in both."""
        n = min(len(self), len(other))
        if self._odd is None and other._odd is None:
            a, b = self._bin, other._bin
            if a[:_WIDTH * n] == b[:_WIDTH * n]:
                return n
            lo, hi = 0, n  # the first n-prefix that differs, by halves (each compare runs in C)
            while lo < hi:
                mid = (lo + hi) // 2
                if a[:_WIDTH * (mid + 1)] == b[:_WIDTH * (mid + 1)]:
                    lo = mid + 1
                else:
                    hi = mid
            return lo
        k = 0
        while k < n and self._at(k) == other._at(k):
            k += 1
        return k

    def take(self, positions: Sequence[int]) -> ItemIds:
        """The ids at `positions`, in that order; a negative position is an empty id (an item without one)."""
        out = bytearray()
        odd: dict[int, str] = {}
        data, zero, n = self._bin, bytes(_WIDTH), len(self)
        for k, p in enumerate(positions):
            if p >= n:
                raise IndexError("item id position out of range")
            if p < 0:
                odd[k] = ""
                out += zero
            elif self._odd is not None and p in self._odd:
                odd[k] = self._odd[p]
                out += zero
            else:
                out += data[_WIDTH * p:_WIDTH * p + _WIDTH]
        return ItemIds(bytes(out), odd)

    def __repr__(self) -> str:
        return f"<ItemIds of {len(self)}>"


Sequence.register(ItemIds)
