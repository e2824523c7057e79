"""Issue 13: get_context_remaining to the contract, new_context, the pending-rollover store, and the
manual checkpoint (CLI and REST)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy import usage as usage_store
from proxy.app.cli import main as cli_main
from proxy.config import Config
from proxy.db import connect
from proxy.dbworker import DBWorker
from proxy.journal import Journal
from proxy.session import SessionIdentity
from proxy.state import StateDir
from proxy.windows.notes import rollover
from tools_server.context import NEW_CONTEXT_OUTPUT, add_context_routes, create_family
from tools_server.registry import CallContext, Services


class World:
    def __init__(self, root: Path):
        self.state = StateDir.open(root / "state")
        self.j = Journal(self.state)
        key, self.task, self.root_addr = self.j.resolve(SessionIdentity("f:a", "fingerprint", None, None), {}, {})
        self.root = self.j.session(key, self.task, self.root_addr)
        self.j.ingest_request(self.root, {"input": [{"role": "user", "content": "hi"}]})
        ckey, _, self.reviewer = self.j.resolve(SessionIdentity("t:c", "header", self.task, "reviewer"), {}, {})
        self.j.ingest_request(self.j.session(ckey, self.task, self.reviewer), {"input": "review"})
        okey, self.other_task, _ = self.j.resolve(SessionIdentity("f:b", "fingerprint", None, None), {}, {})
        self.j.ingest_request(self.j.session(okey, self.other_task, "/root"), {"input": "other"})
        assert self.j.flush()
        self.services = Services(Config(), self.state, None)

    def usage(self, task: str, agent: str, inp: int, out: int, rid: str, at: float, model: str = "gpt-5") -> None:
        conn = connect(self.state.db_path)
        usage_store.record_usage(conn, f"s-{task}-{agent}", task, agent, model,
                                 {"input_tokens": inp, "output_tokens": out}, rid, at)
        conn.close()

    def ctx(self, agent: str | None = None, task: str | None = "") -> CallContext:
        return CallContext(self.services, task=self.task if task == "" else task, agent=agent)


@pytest.fixture
async def world(tmp_path: Path):
    w = World(tmp_path)
    fam = create_family(w.services)
    w.tools = {t.name: t for t in fam.tools()}
    yield w
    await fam.close()
    w.j.close()


def test_schemas_are_codex_s():
    fam = create_family(Services(Config(), StateDir.open(Path("/tmp/ctp-unused-state")), None))
    specs = {t.name: t.function_spec() for t in fam.tools()}
    for name in ("new_context", "get_context_remaining"):
        assert specs[name]["parameters"] == {"type": "object", "properties": {}, "additionalProperties": False}
    assert specs["new_context"]["description"] == ("Start a new context window. Does not clear, reset, or otherwise "
                                                   "affect environment state.")
    assert specs["get_context_remaining"]["description"] == "Get the remaining tokens in the current context window."
    tools = {t.name: t for t in fam.tools()}
    assert tools["new_context"].parallel is False and tools["get_context_remaining"].read_only


async def test_get_context_remaining_contract(world: World):
    call = world.tools["get_context_remaining"].call
    # no task, unknown task: clear errors, never another task's numbers
    notask = await call({}, world.ctx(task=None))
    assert notask.is_error and notask.details["error"] == "no_task" and "x-ctp-task" in notask.text
    unknown = await call({}, world.ctx(task="task_nope"))
    assert unknown.is_error and unknown.details["error"] == "unknown_task"
    # another task's fresher usage does not leak
    world.usage(world.other_task, "/root", 200_000, 10, "resp_other", at=2e9)
    res = await call({}, world.ctx())
    assert not res.is_error and res.text.startswith("You have unknown tokens left in this context window.")
    assert "resp_other" not in str(res.details) and res.details["tokens_left"] is None
    world.usage(world.task, "/root", 100_000, 2_000, "resp_mine", at=1e9)
    res = await call({}, world.ctx())
    hard = int(272_000 * 0.85)
    assert res.details["tokens_left"] == hard - 102_000 and res.details["window_tokens_left"] == 272_000 - 102_000
    assert res.text.splitlines()[0] == f"You have {hard - 102_000} tokens left in this context window."
    assert f"{272_000 - 102_000} of 272000" in res.text  # the whole window, said separately
    assert res.details["agent"] == "/root" and res.details["agents"] == ["/root", "/root/reviewer"]
    assert res.details["window_id"] == world.root.window.window_id and world.root.window.window_id in res.text
    # a relative x-ctp-agent is under /root; its own usage, not the root's
    world.usage(world.task, "/root/reviewer", 1_000, 0, "resp_rev", at=1e9)
    rev = await call({}, world.ctx("reviewer"))
    assert rev.details["agent"] == "/root/reviewer" and rev.details["tokens_left"] == hard - 1_000
    ghost = await call({}, world.ctx("/root/ghost"))
    assert ghost.is_error and ghost.details["error"] == "unregistered_agent"


async def test_new_context_marks_one_pending_rollover(world: World):
    call = world.tools["new_context"].call
    for _ in range(2):  # idempotent
        res = await call({}, world.ctx())
        assert not res.is_error and res.text == NEW_CONTEXT_OUTPUT
    with pytest.raises(Exception, match="unknown field 'x'"):
        await call({"x": 1}, world.ctx())
    remaining = await world.tools["get_context_remaining"].call({}, world.ctx())
    assert "A new context window is pending" in remaining.text
    conn = connect(world.state.db_path)
    try:
        rows = conn.execute("SELECT task_id, address, kind FROM context_rollovers").fetchall()
        assert [tuple(r) for r in rows] == [(world.task, "/root", "new_context")]
        taken = rollover.take_pending(conn, world.task, "/root")
        assert taken is not None and taken.kind == "new_context" and taken.window_id == world.root.window.window_id
        assert rollover.take_pending(conn, world.task, "/root") is None  # consumed once
    finally:
        conn.close()
    notask = await call({}, world.ctx(task=None))
    assert notask.is_error and notask.details["error"] == "no_task"


def test_rollover_store_checkpoint_wins_and_take_is_atomic(tmp_path: Path):
    db = tmp_path / "s.db"
    conn = connect(db)
    assert rollover.mark_pending(conn, "t", "/root", "new_context", at=1.0).kind == "new_context"
    assert rollover.mark_pending(conn, "t", "/root", "checkpoint", "cli", at=2.0).kind == "checkpoint"
    again = rollover.mark_pending(conn, "t", "/root", "new_context", at=3.0)
    assert (again.kind, again.origin, again.requested_at) == ("checkpoint", "cli", 1.0)
    with pytest.raises(ValueError):
        rollover.mark_pending(conn, "t", "/root", "bogus")  # type: ignore[arg-type]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    # Many connections race to take it: exactly one gets it.
    def take() -> rollover.Pending | None:
        c = sqlite3.connect(db, timeout=30, isolation_level=None)
        try:
            return rollover.take_pending(c, "t", "/root")
        finally:
            c.close()
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(8) as pool:
        got = [r for r in pool.map(lambda _: take(), range(16)) if r is not None]
    assert len(got) == 1 and got[0].checkpoint


async def test_rollover_store_through_the_proxys_db_worker(tmp_path: Path):
    worker = DBWorker(tmp_path / "s.db")
    store = rollover.RolloverStore(worker)
    try:
        await store.mark("t", "/root/a")
        assert (await store.peek("t", "/root/a")).kind == "new_context"
        assert (await store.take("t", "/root/a")).address == "/root/a"
        assert await store.take("t", "/root/a") is None
    finally:
        worker.close()


async def test_a_request_with_nothing_pending_never_waits_for_the_db_thread(tmp_path: Path):
    """The proxy asks on every stateless request: with nothing pending it reads on its own connection and
    never queues behind the journal on the database thread; a mark another process commits is still seen."""
    db = tmp_path / "s.db"
    worker = DBWorker(db)
    store = rollover.RolloverStore(worker, db)
    runs = 0
    real = worker.run

    async def counting(fn):
        nonlocal runs
        runs += 1
        return await real(fn)

    worker.run = counting  # type: ignore[method-assign]
    try:
        assert await store.take("t", "/root") is None  # no table yet: the worker creates it
        before = runs
        for _ in range(5):
            assert await store.take("t", "/root") is None
        assert runs == before  # nothing pending: no trip to the database thread
        other = connect(db)  # another process (the tool server's new_context) leaves a mark
        rollover.mark_pending(other, "t", "/root", "new_context")
        other.commit()
        other.close()
        got = await store.take("t", "/root")
        assert got is not None and got.kind == "new_context" and runs == before + 1
        assert await store.take("t", "/root") is None
    finally:
        worker.close()


async def test_manual_checkpoint_cli_and_rest(world: World, capsys):
    state = str(world.state.root)
    assert cli_main(["context", "checkpoint", "--task", world.task, "--agent", "reviewer", "--state-dir", state]) == 0
    assert "checkpoint pending for /root/reviewer" in capsys.readouterr().out
    assert cli_main(["context", "checkpoint", world.root.key, "--state-dir", state]) == 0
    assert cli_main(["context", "checkpoint", "--task", world.task, "--agent", "ghost", "--state-dir", state]) == 1
    assert "not registered" in capsys.readouterr().err
    assert cli_main(["context", "checkpoint", "--state-dir", state]) == 2
    conn = connect(world.state.db_path)
    kinds = {tuple(r) for r in conn.execute("SELECT address, kind, origin FROM context_rollovers")}
    assert kinds == {("/root/reviewer", "checkpoint", "cli"), ("/root", "checkpoint", "cli")}
    rollover.take_pending(conn, world.task, "/root")
    conn.close()

    app = web.Application()
    add_context_routes(app, lambda _app: world.services)
    async with TestClient(TestServer(app)) as client:
        r = await client.post("/v1/context/checkpoint", json={"session": world.root.key})
        assert r.status == 200 and (await r.json())["pending_rollover"] == "checkpoint"
        r = await client.post("/v1/context/checkpoint", json={"task": world.task, "agent": "/root/ghost"})
        assert r.status == 404 and (await r.json())["error"]["code"] == "unknown_agent"
        r = await client.post("/v1/context/checkpoint", json={"session": 3})
        assert r.status == 400
        r = await client.post("/v1/context/checkpoint", data=b"not json")
        assert r.status == 400
    conn = connect(world.state.db_path)
    assert rollover.peek_pending(conn, world.task, "/root").origin == "rest"
    conn.close()


def test_status_says_exactly_what_is_active():
    from proxy.app.status import capability_status
    from proxy.capabilities import capability

    st = capability_status(Config(), "context")
    assert st.state == "active" and "new_context" in st.reason and "rolls over at the session's next" in st.reason
    assert "runs the checkpoint turn" in st.reason and "readable compaction fallback" in st.reason
    assert "not applied yet" not in st.reason
    assert capability("context").tools == ("get_context_remaining", "new_context")
    cfg = Config()
    cfg.context.enabled = False
    assert capability_status(cfg, "context").state == "off"


async def test_new_context_and_remaining_over_rest_and_mcp(tool_server):
    srv = await tool_server()
    j = Journal(srv.services.state)
    task = j.create_task()
    j.close()
    specs = {t["name"]: t for t in await srv.list_rest()}
    assert specs["new_context"]["parameters"] == {"type": "object", "properties": {}, "additionalProperties": False}
    rest = await srv.rest("new_context", {}, task=task)
    assert rest.status == 200 and rest.text == NEW_CONTEXT_OUTPUT
    mcp = await srv.mcp("new_context", {}, task=task)
    assert not mcp.is_error and mcp.text == NEW_CONTEXT_OUTPUT
    assert "new_context" in {t.name for t in await srv.mcp_list()}
    remaining = await srv.mcp("get_context_remaining", {}, task=task)
    assert remaining.text.startswith("You have unknown tokens left") and "pending" in remaining.text
    bad = await srv.rest("new_context", {"reason": "x"}, task=task)
    assert bad.status == 400 and "reason" in bad.body["error"]["message"]
    conn = connect(srv.services.state.db_path)
    try:
        assert [tuple(r) for r in conn.execute("SELECT task_id, address, kind FROM context_rollovers")] == [
            (task, "/root", "new_context")]
    finally:
        conn.close()


async def test_bridged_new_context_marks_the_sessions_agent(emulator, proxy_factory):
    """A session that never declared the tools calls new_context through the bridge: the pending rollover
    is the session's own (its task and agent as the journal resolved them), and the bridge's next round of
    the same request consumes it: the session's notes window opens there
    (tests/proxy/windows/test_context_bridged_rollover.py)."""
    import openai

    from tests.emulator import FunctionCall, Text

    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context,notes"])
    emulator.script(FunctionCall("new_context", {}, call_id="call_nc1"), Text("ok"))
    async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-ctx", max_retries=0) as client:
        resp = await client.responses.create(model="gpt-4.1", input="start over please")
    call = resp.output[0]
    assert call.name == "new_context" and call.output == NEW_CONTEXT_OUTPUT
    import asyncio

    conn = connect(proxy.state_dir / "ctproxy.db")
    try:
        for _ in range(200):  # the journal's rows are written in the background: wait for them (≤ 10 s)
            rows = conn.execute("SELECT w.task_id, w.address, w.reason, s.session_key FROM journal_windows w JOIN"
                                " journal_sessions s ON s.session_key = w.session_key"
                                " WHERE w.strategy = 'notes'").fetchall()
            if rows:
                break
            await asyncio.sleep(0.05)
        pending = conn.execute("SELECT count(*) FROM context_rollovers").fetchone()[0]
    finally:
        conn.close()
    assert len(rows) == 1 and rows[0]["reason"] == "new_context_midturn" and rows[0]["address"] == "/root"
    assert pending == 0  # consumed by the bridge's next round, not left for the agent's next request
