"""Big inputs (issue 10.3): the journal does their per-item work without holding its lock, so other
requests never wait behind a 100k-item alignment, and the ids are the same as without that step."""

from __future__ import annotations

import pytest

import proxy.journal.branch as branch_mod
import proxy.journal.ingest as ingest_mod
import proxy.journal.journal as journal_mod
from proxy.journal import Journal
from proxy.state import StateDir


def _conversation(n: int, tag: str = "") -> list[dict]:
    return [{"type": "message", "role": "user" if i % 2 == 0 else "assistant",
             "content": [{"type": "input_text" if i % 2 == 0 else "output_text", "text": f"{tag}item {i} " + "z" * 40}]}
            for i in range(n)]


def _turns(j: Journal) -> list[list[str]]:
    """A new big session, a resend with two more items, an edit in the middle, then a small turn."""
    base = _conversation(3000)
    inputs = [base, base + _conversation(2, "more "), base[:1500] + _conversation(10, "edit "), [base[0]]]
    key_task = j.create_task()
    out = []
    for inp in inputs:
        st = j.session("sess", key_task, "/root", None)
        mark = j.begin_request(st.key, st.task_id, st.address, None, {"input": inp})
        j.settle()
        out.append(list(mark.input_ids))
    return out


@pytest.fixture
def small_prepare(monkeypatch):
    monkeypatch.setattr(ingest_mod, "PREPARE_MIN_BYTES", 1024)


def test_hashing_a_big_input_happens_outside_the_journal_lock(tmp_path, small_prepare, monkeypatch):
    j = Journal(StateDir.open(tmp_path / "state"))
    held: list[bool] = []

    def spying(real):
        def spy(item):
            held.append(j._lock._is_owned())  # RLock: owned by the calling thread?
            return real(item)
        return spy

    # InputView hashes with canonical_hash, a big input's ColumnView with canonical_digest
    monkeypatch.setattr(branch_mod, "canonical_hash", spying(branch_mod.canonical_hash))
    monkeypatch.setattr(branch_mod, "canonical_digest", spying(branch_mod.canonical_digest))
    try:
        task = j.create_task()
        st = j.session("sess", task, "/root", None)
        mark = j.begin_request(st.key, st.task_id, st.address, None, {"input": _conversation(3000)})
        j.settle()
        assert len(mark.input_ids) == 3000
    finally:
        j.close()
    assert len(held) >= 3000
    assert sum(held) == 0, f"{sum(held)} of {len(held)} items hashed while holding the journal's lock"


def test_prepared_and_unprepared_alignment_give_the_same_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(ingest_mod, "PREPARE_MIN_BYTES", 1 << 40)  # never prepared
    j1 = Journal(StateDir.open(tmp_path / "a"))
    try:
        plain = _turns(j1)
    finally:
        j1.close()
    monkeypatch.setattr(ingest_mod, "PREPARE_MIN_BYTES", 1024)  # every big turn prepared
    j2 = Journal(StateDir.open(tmp_path / "b"))
    prepared_calls = []
    real = j2._prepare_next

    def counting():
        prepared_calls.append(1)
        real()

    j2._prepare_next = counting
    try:
        fast = _turns(j2)
    finally:
        j2.close()
    assert prepared_calls
    assert plain == fast  # ids hang from the session's root, the same key in both journals



def test_the_caches_are_bounded_in_bytes(tmp_path):
    j = Journal(StateDir.open(tmp_path / "state"), cache_bytes=2 << 20)  # 2 MiB: about two 3000-item sessions
    try:
        task = j.create_task()
        for n in range(6):
            st = j.session(f"s{n}", task, f"/root/a{n}", None)
            mark = j.begin_request(st.key, st.task_id, st.address, None, {"input": _conversation(3000, f"{n} ")})
            j.settle()
            assert len(mark.input_ids) == 3000
            assert j.cached_bytes() <= 2 << 20 or len(j._sessions) == 1
        assert len(j._sessions) < 6
    finally:
        j.close()


def test_a_session_dropped_before_its_writes_commit_continues_its_branch(tmp_path):
    """Dropped from the cache while the writer still holds its writes: taken back, not read stale."""
    j = Journal(StateDir.open(tmp_path / "state"), cache_bytes=1)  # every other session is dropped at once
    try:
        task = j.create_task()
        first = _conversation(50, "a ")
        st = j.session("A", task, "/root/a", None)
        m1 = j.begin_request(st.key, st.task_id, st.address, None, {"input": first})
        j.settle()
        other = j.session("B", task, "/root/b", None)  # drops A
        j.begin_request(other.key, other.task_id, other.address, None, {"input": _conversation(5, "b ")})
        j.settle()
        assert "A" not in j._sessions
        st = j._session("A")
        m2 = j.begin_request(st.key, st.task_id, st.address, None, {"input": first + _conversation(2, "more ")})
        j.settle()
        assert m2.kind == "continue"
        assert m2.input_ids[:50] == m1.input_ids
    finally:
        j.close()


def test_known_tasks_and_agents_are_bounded_and_still_found_after_being_forgotten(tmp_path, monkeypatch):
    """A stream of new sessions (a task each) must not grow the journal's memory without bound."""
    monkeypatch.setattr(journal_mod, "CACHED_KNOWN", 5)
    j = Journal(StateDir.open(tmp_path / "state"))
    try:
        tasks = []
        for n in range(20):
            task = j.create_task()
            tasks.append(task)
            st = j.session(f"s{n}", task, "/root", None)
            j.begin_request(st.key, st.task_id, st.address, None, {"input": _conversation(2, f"{n} ")})
            j.settle()
        assert len(j._tasks) <= 5 and len(j._agents) <= 5
        assert j.flush()
        assert all(j.task_exists(t) for t in tasks)  # forgotten by the cache, found in the database
        assert j.agent_exists(tasks[0], "/root")
    finally:
        j.close()


class _Walks(dict):
    """The journal's session cache, counting walks over every cached session."""

    walks = 0

    def values(self):
        type(self).walks += 1
        return super().values()

    def items(self):
        type(self).walks += 1
        return super().items()


def _full_count(j: Journal) -> int:
    resends = sum(len(r.whole) + 16 * len(r.ids) for _, r in list(j._resends.values()))
    return resends + journal_mod.ENTRY_BYTES * sum(len(st.entries) for st in dict.values(j._sessions))


def test_the_cache_bound_is_checked_without_walking_every_session(tmp_path, monkeypatch):
    """The bound on what the caches hold is checked on every request and answer (on the request path, and by the
    writer): the count is kept as sessions come, grow, are rewritten, dropped and let go, not summed each time."""
    monkeypatch.setattr(journal_mod, "CACHED_SESSIONS", 6)
    j = Journal(StateDir.open(tmp_path / "state"), big_entries=40, release_after=0.0)
    try:
        walked = _Walks()
        j._sessions = walked  # (an OrderedDict's move_to_end / popitem(last=False) are used: give them back)
        walked.move_to_end = lambda key: walked.__setitem__(key, walked.pop(key))
        walked.popitem = lambda last=True: (k := next(iter(walked)), walked.pop(k))
        task = j.create_task()
        for n in range(10):
            key = f"s{n}"
            st = j._session(key, task, "/root", None)
            for turn in range(3):  # a new session, a longer resend, then an edit that rewrites the branch
                items = _conversation(5 + 10 * turn, f"{n} ") if turn < 2 else _conversation(3, f"edit {n} ")
                mark = j.begin_request(st.key, st.task_id, st.address, None, {"input": items})
                j.settle()
                j.end_response(mark, [{"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": f"answer {n} {turn}"}]}], response_id=f"r{n}-{turn}",
                    model="m", status="completed", usage=None, error=None, incomplete=False)
                j.settle()
                assert j.cached_bytes() == _full_count(j)
        assert _Walks.walks == 0
        assert len(j._sessions) == 6  # older sessions dropped from the cache, counted out
        j.cache_bytes = journal_mod.ENTRY_BYTES * 20  # over the budget: sessions and resends go
        j._bound_caches(keep="s9")
        assert j.cached_bytes() == _full_count(j)
        assert j.cached_bytes() <= j.cache_bytes or list(j._sessions) == ["s9"]
        j.cache_bytes = 1 << 30
        big = j._session("big", task, "/root", None)
        mark = j.begin_request(big.key, big.task_id, big.address, None, {"input": _conversation(50, "big ")})
        j.settle()
        assert j.cached_bytes() == _full_count(j)
        j._release_idle()  # idle past `release_after`: let go, counted out
        assert "big" not in j._sessions and j.cached_bytes() == _full_count(j)
    finally:
        j.close()
