"""The journal's window ordinals per (task, agent): a bounded cache (one entry a task would otherwise stay for good,
and a proxy serving conversations without task headers opens a task for each), that never hands out a taken id."""

from __future__ import annotations

import pytest

import proxy.journal.journal as journal_mod
from proxy.journal import Journal
from proxy.state import StateDir


@pytest.fixture
def journal(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "CACHED_KNOWN", 3)
    j = Journal(StateDir.open(tmp_path / "state"))
    yield j
    j.close()


def test_the_ordinals_of_tasks_come_and_go_within_the_bound(journal):
    for n in range(40):
        journal.session(f"s{n}", journal.create_task(), "/root", None)
    assert journal.flush()
    journal.session("last", journal.create_task(), "/root", None)  # (entries set aside go once committed)
    assert len(journal._ordinals) <= 4, len(journal._ordinals)


def test_a_task_let_go_before_its_window_is_committed_still_gets_the_next_ordinal(journal):
    journal.writer.batch_interval = 60.0  # the writer does not drain by itself within this test
    task = journal.create_task()
    first = journal.session("a1", task, "/root", None)
    for n in range(6):  # other tasks push the first one out of the cache, nothing committed yet
        journal.session(f"other{n}", journal.create_task(), "/root", None)
    second = journal.session("a2", task, "/root", None)  # the same agent's next session: its next window
    assert (first.window.window_id, second.window.window_id) == ("w1", "w2")
    assert journal.flush()
    assert [w.window_id for w in journal.windows("a1")] == ["w1"]
    assert [w.window_id for w in journal.windows("a2")] == ["w2"]


def test_a_task_let_go_after_its_windows_were_committed_reads_its_ordinal_back(journal):
    task = journal.create_task()
    journal.session("b1", task, "/root", None)
    assert journal.flush()
    for n in range(6):
        journal.session(f"other{n}", journal.create_task(), "/root", None)
    assert journal.flush()
    journal.session("spare", journal.create_task(), "/root", None)
    assert (task, "/root") not in journal._ordinals._live and (task, "/root") not in journal._ordinals._aside
    assert journal.session("b2", task, "/root", None).window.window_id == "w2"
