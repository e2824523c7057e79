"""A session's branch in columns (proxy/journal/branch.py Branch): what a reader gets is what the entries said,
through slices, sums and fingerprint updates; a big input's positions come straight from its ColumnView."""

from __future__ import annotations

import pytest

from proxy.items.canonical import canonical_hash, chain_ids, fingerprint
from proxy.journal.branch import Branch, ColumnView, Entry, InputView, align

ITEMS = [{"type": "message", "role": "user", "content": f"q{i}"} for i in range(5)] + [
    {"type": "reasoning", "summary": []}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]


def _entries() -> list[Entry]:
    ids = chain_ids(ITEMS, "root:s")
    view = InputView(ITEMS)
    out = [Entry(ids[k], view.canon(k), view.type(k), view.fp(k)) for k in range(len(ITEMS))]
    out[2].fp = None  # read back from the database: no fingerprint
    return out


def test_a_branch_reads_back_the_entries_it_was_made_of():
    entries = _entries()
    branch = Branch.of(entries)
    assert len(branch) == len(entries) and bool(branch) and not Branch()
    assert list(branch) == entries and branch[-1] == entries[-1] and branch.ids == [e.item_id for e in entries]
    assert [branch.canon(k) for k in range(len(entries))] == [e.canon for e in entries]
    assert branch[5].skippable and not branch[0].skippable
    with pytest.raises(IndexError):
        branch[len(entries)]
    assert list(branch[2:5]) == entries[2:5] and list(branch[5:2]) == [] and list(branch[::2]) == entries[::2]
    assert list(branch[:3] + branch[3:]) == entries and list(branch[:3] + entries[3:]) == entries


def test_a_fingerprint_update_and_a_canonical_hash_that_is_not_a_digest():
    entries = _entries()
    entries[1].canon = "c1"  # not 64 hex digits (the aligner's tests use such): kept as it is
    branch = Branch.of(entries)
    assert branch[1].canon == "c1" and branch[1:3][0].canon == "c1"
    assert (Branch.of(entries[:1]) + branch)[2].canon == "c1"
    assert branch[2].fp is None
    branch.set_fp(2, fingerprint(b'{"x":1}'))
    assert branch.fp(2) == fingerprint(b'{"x":1}') and branch[2].fp == fingerprint(b'{"x":1}')
    assert entries[2].fp is None  # the entries it was made of are not changed


def test_a_big_inputs_positions_come_from_its_column_view():
    view = ColumnView(iter(ITEMS))
    ids = chain_ids(ITEMS, "root:s")
    from_view = view.branch(2, ids[2:])
    assert list(from_view) == [Entry(ids[k], canonical_hash(ITEMS[k]), InputView(ITEMS).type(k),
                                     InputView(ITEMS).fp(k)) for k in range(2, len(ITEMS))]
    # The aligner reads a Branch as it reads a list of entries.
    whole = Branch.of(_entries())
    assert align(whole, ITEMS).kind == align(_entries(), ITEMS).kind == "continue"
    assert align(whole, [*ITEMS[:3], {"role": "user", "content": "edit"}]).keep == 3
