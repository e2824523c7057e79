"""proxy/journal/itemids.py: item ids in a column read as the list of strings they stand for."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.items.canonical import chain_digest, chain_id, session_root
from proxy.journal.itemids import ItemIds

_hex_ids = st.text("0123456789abcdef", min_size=16, max_size=16).map(lambda h: "it_" + h)
# ids of other forms a store may hold: kept as they are, by position
_odd_ids = st.one_of(st.just(""), st.text(max_size=8), st.text("0123456789ABCDEF", min_size=16, max_size=16)
                     .map(lambda h: "it_" + h), _hex_ids.map(lambda i: i + "0"))
_ids = st.lists(st.one_of(_hex_ids, _hex_ids, _hex_ids, _odd_ids), max_size=40)


@settings(max_examples=300, deadline=None)
@given(_ids, _ids, st.integers(-45, 45), st.integers(-45, 45), st.integers(-3, 3).filter(bool))
def test_a_column_reads_as_the_list_of_its_ids(a, b, lo, hi, step):
    x, y = ItemIds.of(a), ItemIds.of(b)
    assert list(x) == a and len(x) == len(a) and bool(x) == bool(a) and isinstance(x, Sequence)
    assert x == a and a == x and x == tuple(a) and x == ItemIds.of(a) and (x == b) == (a == b)
    assert list(reversed(x)) == a[::-1]
    for k in range(-len(a), len(a)):
        assert x[k] == a[k]
    with pytest.raises(IndexError):
        x[len(a)]
    assert list(x[lo:hi]) == a[lo:hi] and list(x[lo:hi:step]) == a[lo:hi:step] and x[lo:hi] == ItemIds.of(a[lo:hi])
    assert list(x + y) == a + b and list(x + b) == a + b and list(tuple(a) + y) == a + b
    assert x.common_prefix(y) == next((k for k, (p, q) in enumerate(zip(a, b, strict=False)) if p != q),
                                      min(len(a), len(b)))
    for value in [*a[:3], *b[:3], "it_" + "0" * 16]:
        expect = max((k for k, v in enumerate(a) if v == value), default=None)
        assert x.last_index(value) == expect and (value in x) == (expect is not None)


@given(_ids, st.lists(st.integers(-1, 39), max_size=30))
def test_take_reads_positions_and_a_negative_one_is_an_empty_id(a, positions):
    x = ItemIds.of(a)
    positions = [p for p in positions if p < len(a)]
    assert list(x.take(positions)) == [a[p] if p >= 0 else "" for p in positions]
    with pytest.raises(IndexError):
        x.take([len(a)])


def test_a_match_across_two_ids_is_not_an_id():
    a, b = "it_00112233" + "44556677", "it_8899aabb" + "ccddeeff"
    x = ItemIds.of([a, b])
    assert x.last_index("it_44556677" + "8899aabb") is None and x.last_index(b) == 1


def test_the_chained_digest_is_the_ids_bytes():
    parent = session_root("s")
    for canon in ("a" * 64, "b" * 64, "c" * 64):
        assert "it_" + chain_digest(parent, canon).hex() == chain_id(parent, canon)
        assert ItemIds(chain_digest(parent, canon))[0] == chain_id(parent, canon)
        parent = chain_id(parent, canon)
