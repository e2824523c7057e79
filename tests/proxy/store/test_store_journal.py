"""The journal behind the store interface (proxy/store/interface.JournalBackend, ADR 0013), on both stores: the
embedded one (SQLite in the state directory) and PostgreSQL (a real private server, tests/support/postgres.py, a
fresh database per test).

Two instances: on the embedded store, two `Journal`s on one state directory (two workers of one `ctproxy up`); on
PostgreSQL, two stores (each its own pool) on one database, each journal with a state directory of its own (two
`ctproxy up` on two machines). A stateless conversation whose turns alternate between them is one session with
every item once, in order; a response id recorded through A resolves through B."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proxy.journal import Journal
from proxy.journal.model import window_id
from proxy.journal.ops import EnsureAgent, EnsureSession, EnsureTask, PutWindow
from proxy.journal.query import ItemFilter
from proxy.state import StateDir
from proxy.store.embedded import EmbeddedStore
from proxy.store.interface import JournalBackend, Store
from tests.support.postgres import unavailable

_COUNT = itertools.count()
# (a journal on one more instance, its store)
Opener = Callable[..., tuple[Journal, Store]]


@pytest.fixture(params=["embedded", "postgresql"])
def instance(request, tmp_path: Path) -> Iterator[Opener]:
    """Opens one more instance on the same state: a journal and the store it lives in."""
    opened: list[tuple[Journal, Store]] = []
    if request.param == "embedded":
        state = StateDir.open(tmp_path / "state")

        def opener(shared: bool = False) -> tuple[Journal, Store]:
            store = EmbeddedStore(state)
            # (`shared`: two journals on one state directory, the workers of one `ctproxy up --workers 2`)
            opened.append((Journal(state, backend=store.journal(), shared=shared or None), store))
            return opened[-1]
    else:
        if (why := unavailable()) is not None:
            pytest.skip(why)
        from proxy.store.pg import PostgresStore

        url = request.getfixturevalue("pg").fresh_database(f"journal{next(_COUNT)}")

        def opener(shared: bool = False) -> tuple[Journal, Store]:
            store = PostgresStore.open(url, max_size=4)
            state = StateDir.open(tmp_path / f"state{len(opened)}")  # each instance its own state directory
            opened.append((Journal(state, backend=store.journal()), store))
            return opened[-1]
    yield opener
    for journal, store in opened:
        journal.close()
        store.close()


def _msg(role: str, text: str) -> dict:
    return {"role": role, "content": text}


def _out(text: str, n: int) -> dict:
    return {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _resent(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def _turn(j: Journal, key: str, task: str, history: list[dict], n: int, question: str | None = None) -> None:
    st = j.session(key, task, "/root", "fingerprint")
    history.append(_msg("user", question or f"question {n}"))
    mark = j.ingest_request(st, {"input": list(history)})
    j.ingest_response(mark, [_out(f"answer {n}", n)], response_id=f"resp_{n}", model="gpt-5", status="completed",
                      usage=None, error=None, incomplete=False)
    history.append(_resent(f"answer {n}"))
    assert j.flush()


def _texts(store: Store, task: str) -> list[str]:
    rows, more = store.journal().history().list_items(task, "/root", ItemFilter(), 1000, False, 1000)
    assert not more
    return [r.text for r in rows]


def test_both_stores_hold_the_journal_interface(instance):
    journal, store = instance()
    assert isinstance(store.journal(), JournalBackend)
    assert journal.backend is store.journal()
    assert journal.backend.kind == store.kind


def test_a_sessions_items_in_order_its_windows_aliases_and_events(instance):
    j, store = instance()
    task = j.create_task()
    assert j.task_exists(task) and not j.task_exists("t_nothing")
    history: list[dict] = []
    for n in range(3):
        _turn(j, "f:one", task, history, n)
    backend = store.journal()
    assert backend.session("f:one") == (task, "/root", "fingerprint")
    assert j.agent_exists(task, "/root") and backend.agent_exists(task, "/root")
    branch = [row[0] for row in backend.branch("f:one")]
    assert branch == j.item_ids_for_session("f:one") and len(branch) == 6
    assert _texts(store, task) == [t for n in range(3) for t in (f"question {n}", f"answer {n}")]
    raw = j.raw_items([branch[1], branch[0], "unknown"])
    assert [r.get("id") for r in raw] == ["msg_0", None] and raw[1]["content"] == "question 0"
    # A window opened and the items after its boundary filed in it.
    opened = j.start_window("f:one", branch[3], "notes", {"note": "checkpoint"})
    assert j.flush()
    assert [w.window_id for w in j.windows("f:one")] == [window_id(1), opened.window_id]
    assert backend.latest_window("f:one").window_id == opened.window_id == window_id(2)
    windows, total = backend.history().list_windows(task, "/root", 10, False)
    assert total == 2 and [(w.window_id, w.items, w.current) for w in windows] == [("w1", 4, False), ("w2", 2, True)]
    # Aliases resolve, events are kept in order.
    j.alias_response("resp_extra", "f:one")
    assert j.flush()
    assert backend.session_for_response("resp_extra") == backend.session_for_response("resp_1") == "f:one"
    assert backend.session_for_response("resp_nothing") is None
    assert backend.sessions_for_responses(["resp_nothing", "resp_1", "resp_extra"]) == {
        "resp_1": "f:one", "resp_extra": "f:one"}  # several in one query: those found
    assert backend.sessions_for_responses([]) == {}
    assert backend.response_tail("resp_2") == branch[-1]
    assert [e["kind"] for e in j.events("f:one")][-1] == "window"


def test_history_search_finds_a_literal_substring_and_reads_an_item(instance):
    j, store = instance()
    task = j.create_task()
    history: list[dict] = []
    questions = ["the rate is 50%_off today", "the rate is 50 off today", "RATE in capitals", "nothing here"]
    for n, q in enumerate(questions):
        _turn(j, "f:search", task, history, n, question=q)
    reader = store.journal().history()
    hits, more = reader.search(task, "/root", "50%_off", ItemFilter(), 10, False)
    assert not more and [h.row.text for h in hits] == [questions[0]]  # the wildcards are literal
    hits, _ = reader.search(task, "/root", "rate", ItemFilter(), 10, False)
    assert [h.row.text for h in hits] == questions[:2]  # case-sensitive: not "RATE"
    hits, more = reader.search(task, "/root", "answer", ItemFilter(), 2, True)
    assert more and [h.row.text for h in hits] == ["answer 3", "answer 2"]  # newest first, stopped at the limit
    assert reader.search(task, "/root", "absent words", ItemFilter(), 10, False) == ([], False)
    item = reader.get_item(task, "/root", hits[0].row.item_id)
    assert item is not None and item[0].text == "answer 3" and item[2] and b"msg_3" in item[1]
    assert reader.agents(task) == ["/root"] and reader.sessions(task, "/root") == ["f:search"]


def test_a_window_claimed_on_a_taken_ordinal_takes_the_next(instance):
    _, store = instance()
    backend = store.journal()
    ops = [EnsureTask("t1", "session", 1.0), EnsureAgent("t1", "/root", 1.0),
           EnsureSession("s1", "t1", "/root", None, 1.0)]
    first = backend.create_session(ops, PutWindow("t1", "/root", "w1", 1, "s1", None, "start", {}, 1.0), "A")
    assert first is not None and first.window_id == "w1"
    assert backend.create_session(ops, PutWindow("t1", "/root", "w1", 1, "s1", None, "start", {}, 1.0), "B") is None
    second = backend.claim_window(PutWindow("t1", "/root", "w1", 1, "s1", None, "notes", {"n": 1}, 2.0), "B")
    assert (second.ordinal, second.window_id) == (2, "w2")
    assert [(w.window_id, w.strategy) for w in backend.windows("s1")] == [("w1", "start"), ("w2", "notes")]
    assert backend.stamp("s1") == ("B", 2)


def test_a_moved_claim_rebuilds_a_bootstrap_that_names_the_window(instance):
    _, store = instance()
    backend = store.journal()
    ops = [EnsureTask("t1", "session", 1.0), EnsureAgent("t1", "/root", 1.0),
           EnsureSession("s1", "t1", "/root", None, 1.0)]
    backend.create_session(ops, PutWindow("t1", "/root", "w1", 1, "s1", None, "start", {}, 1.0), "A")
    claimed = backend.claim_window(PutWindow("t1", "/root", "w1", 1, "s1", None, "notes", {"names": "w1"}, 2.0), "B",
                                   lambda op: op._replace(bootstrap={"names": op.window_id}))
    assert (claimed.window_id, claimed.bootstrap) == ("w2", {"names": "w2"})
    assert [(w.window_id, w.bootstrap) for w in backend.windows("s1")] == [("w1", {}), ("w2", {"names": "w2"})]


def test_a_window_whose_ordinal_another_instance_took_names_the_id_it_got(instance, monkeypatch):
    """The peek and the claim are two steps: when another instance opens a window of the same agent in between,
    the claim moves to the next ordinal, and the notes bootstrap (which names the window and the one it follows)
    is built again for the id it got, in the journal and in the store."""
    (a, store_a), (b, _) = instance(shared=True), instance(shared=True)
    if not store_a.journal().claims_windows:
        pytest.skip("the embedded store opens windows in its writer's batch, not by a claim")
    task = a.create_task()
    history: list[dict] = []
    _turn(a, "f:one", task, history, 0)
    _turn(b, "f:two", task, [], 1, question="another conversation of the same agent")
    stale = a.backend.max_ordinal(task, "/root") - 1  # what A read just before B's window landed
    monkeypatch.setattr(a.backend, "max_ordinal", lambda *_: stale)
    w = a.start_window("f:one", None, "notes", lambda prev, wid: {"names": wid, "follows": prev.window_id})
    assert w.window_id == window_id(stale + 2) and w.bootstrap == {"names": w.window_id, "follows": "w1"}
    assert {x.window_id: x.bootstrap for x in b.windows("f:one")}[w.window_id] == w.bootstrap


def test_two_instances_alternating_turns_make_one_session_in_order(instance):
    """The key property of a shared store: turns of one stateless conversation land on A, B, A, … and the
    journal holds one session with each item once, in order; a response id recorded through A resolves through B."""
    (a, store_a), (b, store_b) = instance(shared=True), instance(shared=True)
    task = a.create_task()
    history: list[dict] = []
    for n in range(8):
        _turn(a if n % 2 == 0 else b, "f:conv", task, history, n)
    expected = [t for n in range(8) for t in (f"question {n}", f"answer {n}")]
    assert _texts(store_a, task) == _texts(store_b, task) == expected
    assert store_b.journal().history().sessions(task, "/root") == ["f:conv"]
    assert len(store_a.journal().branch("f:conv")) == 16
    assert [w.window_id for w in b.windows("f:conv")] == ["w1"]  # one session, one window: nobody opened a second
    assert "resp_0" not in b._aliases  # recorded through A only
    assert b.session_for_response("resp_0") == "f:conv"
    assert a.session_for_response("resp_7") == "f:conv"
    # Each journal's cached state catches up with what the other wrote.
    assert len(a.session("f:conv").entries) in (14, 16)
    a.refresh(a.session("f:conv"))
    assert len(a.session("f:conv").entries) == len(b.session("f:conv").entries) == 16
    # A window opened through B is seen by A's next turn, and A numbers its own after it.
    opened = b.start_window("f:conv", None, "notes", {"note": "checkpoint"})
    assert b.flush()
    _turn(a, "f:conv", task, history, 8)
    assert a.window_of("f:conv").window_id == opened.window_id
    later = a.start_window("f:conv", None, "fallback", {"text": "x"})
    assert later.ordinal == opened.ordinal + 1


async def test_the_history_tools_read_the_journal_of_the_tool_servers_store(instance, tmp_path: Path):
    """A tool server (its own state directory) given the store reads the journal there: what a journal of another
    instance wrote is searched, listed and read through `history_*` (Services.state_store().journal().history())."""
    from proxy.config import Config
    from tools_server.history import create_family
    from tools_server.registry import CallContext, Services

    j, store = instance()
    task = j.create_task()
    history: list[dict] = []
    _turn(j, "f:tools", task, history, 0, question="where is the needle-42 kept?")
    _turn(j, "f:tools", task, history, 1)
    root = tmp_path / "tool_server"
    services = Services(Config(), StateDir.open(root), root, store=store)
    tools = {t.name: t for t in create_family(services).tools()}
    ctx = CallContext(services, task=task)
    found = await tools["history_search_contents"].call({"query": "needle-42"}, ctx)
    assert not found.is_error, found.text
    assert "needle-42" in found.text and "question 1" not in found.text
    listed = await tools["history_list_items"].call({}, ctx)
    assert not listed.is_error and "answer 1" in listed.text
    unknown = await tools["history_search_contents"].call({"query": "needle"}, CallContext(services, task="t_none"))
    assert unknown.is_error


def test_history_search_takes_every_road_and_finds_what_a_plain_scan_finds(instance, monkeypatch):
    """The PostgreSQL reader walks the newest items in chunks and continues by the trigram index when that is
    cheaper (proxy/store/pg_journal.py, `_candidates`): with a chunk of 8 items, a literal frequent among the newest
    (walk), one rare and old (trigram), one whose words are common but which is absent (walks on), one with no
    trigram (keyset pages) all find exactly what scanning every item finds, newest or oldest first, at any limit."""
    from bench.bench_store import _register
    from bench.bench_store import _turn as ops_of_turn
    from proxy.store import pg_journal

    _, store = instance()
    if store.kind != "postgresql":
        pytest.skip("the roads are the PostgreSQL reader's (the embedded one's FTS5 is tested above)")
    monkeypatch.setattr(pg_journal, "WALK_ROWS", 8)
    monkeypatch.setattr(pg_journal, "_TRIGRAM_FIXED", 0)  # (at 300 items the index's fixed cost would never pay)
    roads: list[str] = []
    trigram = pg_journal.PgHistoryReader._trigram
    monkeypatch.setattr(pg_journal.PgHistoryReader, "_trigram",
                        lambda self, *a: roads.append("trigram") or trigram(self, *a))
    backend = store.journal()
    stamp = "t"
    texts: list[str] = []
    ops = _register("s:roads", "t_roads")
    for n in range(150):
        pair = (f"the river and the stone #{2 * n}" + (" needle-Xq9" if n % 37 == 5 else ""),
                f"river stone answer #{2 * n + 1}" if n >= 130 else f"stone then river #{2 * n + 1}")
        texts += pair
        ops += ops_of_turn("s:roads", n, 2 * n, pair)
    backend.apply(ops, stamp)
    reader = backend.history()
    for query in ("river stone", "needle-Xq9", "river stonx", "#1", "Xq", "stone #29"):
        roads.clear()
        found = [t for t in texts if query in t]
        for recent_first in (True, False):
            expected = found[::-1] if recent_first else found
            for limit in (3, 50):
                hits, more = reader.search("t_roads", "/root", query, ItemFilter(), limit, recent_first)
                assert [h.row.text for h in hits] == expected[:limit], (query, recent_first, limit)
                assert more == (len(expected) > limit), (query, recent_first, limit)
        assert bool(roads) == (query in ("needle-Xq9", "river stonx")), (query, roads)  # rare: the trigram index


def test_a_big_input_is_written_from_its_buffers_with_the_same_ids_and_json(instance, monkeypatch):
    """A big input's items go to the store as PutItems ops read from one ColumnView (proxy/journal/branch.py):
    the ids of the one hash chain, the branch and the stored JSON the per-item path gives, on both stores."""
    import orjson

    import proxy.journal.ingest as ingest_mod
    from proxy.items.canonical import chain_ids, session_root

    inp = [_msg("user" if i % 2 == 0 else "assistant", f"item {i} é") for i in range(1200)]
    inp[7] = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    body = orjson.dumps(inp)
    written: list[int] = []
    real = ingest_mod._put_items
    monkeypatch.setattr(ingest_mod, "_put_items", lambda *a: written.append(1) or real(*a))
    monkeypatch.setattr(ingest_mod, "PUT_ITEMS_CHUNK", 500)  # three ops, the last one short
    j, store = instance()
    task = j.create_task()
    for key, least in (("f:per-item", 1 << 40), ("f:big", 1024)):
        monkeypatch.setattr(ingest_mod, "PREPARE_MIN_BYTES", least)
        st = j.session(key, task, "/root", "fingerprint")
        mark = j.begin_request(st.key, st.task_id, st.address, "fingerprint", {"input": inp}, body)
        ids = list(mark.input_ids)
        assert j.flush()
        assert ids == chain_ids(inp, session_root(key))
        assert [row[0] for row in store.journal().branch(key)] == ids
        assert j.raw_items(ids) == inp
        assert len(written) == (key == "f:big")
