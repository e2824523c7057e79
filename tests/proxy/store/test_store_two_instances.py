"""Issue 32: two `ctproxy up` on one PostgreSQL database (`--store URL`), each with its own state directory, through
the real CLI, proxies and tool servers, against the Responses emulator (ADR 0013, "Wiring").

- a note written through A's tool server is read through B's (and no note file exists on either disk);
- `new_context` marked through A rolls over B's next request for the agent (B forwards the new window's bootstrap;
  B runs `--workers 2`, each worker on its own store);
- a manual checkpoint asked of A (`POST /v1/context/checkpoint` on A's tool server) is taken by B's next request
  for the agent: B runs the checkpoint turn and forwards in window w2;
- `kill -9` of A loses nothing A committed (its note is read through B), and B goes on serving;
- a stateless conversation whose turns alternate between A and B is one session (the journal is the store's);
- the window an upstream showed A (an overflow A recovered) makes B compact a new conversation before it
  overflows (compaction's records are the store's), though B had served that model before (no restart);
- B's dashboard API lists the task, session and items journaled through A; `tasks_report` on B's state directory
  with the store reads them too;
- a sub-agent that joined through A is known to B's Codex backend routes (`current_agent_name`);
- `ctproxy tasks` and `ctproxy show` on B's state directory read the store's journal: turns through A and B;
- `ctproxy task new` on A's state directory registers the task in the store, so B knows it too;
- an unreachable store stops `ctproxy up` with what to do, nothing left running; the password of a URL is never
  shown (log, run.json, status); `ctproxy status` names the store and says whether it is reachable.

A private PostgreSQL server (tests/support/postgres.py), one fresh database per test; skipped with the reason where
PostgreSQL cannot be had.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.windows.notes.checkpoint_turn import CHOICE as CHECKPOINT_CHOICE
from tests.emulator import FunctionCall, Response, Text
from tests.support.cli import ctproxy as cli
from tests.support.postgres import PrivateServer
from tests.support.proxyproc import ProxyProcess

pytestmark = pytest.mark.timeout(240)
_COUNT = itertools.count()
NEW_CONTEXT_SPEC = {"type": "function", "name": "new_context", "description": "Start a new context window.",
                    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}


@pytest.fixture
def db_url(pg: PrivateServer) -> str:
    return pg.fresh_database(f"two{next(_COUNT)}")




def text_of(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


class Instance:
    """One `ctproxy up --store URL`: its proxy, its tool server (REST as the task's agent)."""

    def __init__(self, proc: ProxyProcess, task: str, agent: str = "/root"):
        self.proc, self.task, self.agent = proc, task, agent
        token = (proc.state_dir / "token").read_text().strip()
        self.headers = {"Authorization": f"Bearer {token}", "x-ctp-task": task, "x-ctp-agent": agent}

    async def tool(self, name: str, args: dict[str, Any], ok: bool = True) -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as http, http.post(
                f"{self.proc.tools_url}/v1/tools/{name}", json=args, headers=self.headers) as r:
            body = await r.json()
            if ok:
                assert r.status == 200, body
            return r.status, body

    async def create(self, items: list[dict[str, Any]], **kwargs: Any) -> Any:
        args = {"base_url": self.proc.url + "/v1", "api_key": "sk-test-store", "max_retries": 0,
                "default_headers": {"x-ctp-task": self.task, "x-ctp-agent": self.agent}}
        async with openai.AsyncOpenAI(**args) as client:
            return await client.responses.create(model="gpt-4.1", store=False, input=items, **kwargs)

    async def knows_task(self) -> None:
        """The tool server answers for the task (it checks the task against the store's journal)."""
        body: dict[str, Any] = {}
        for _ in range(200):
            status, body = await self.tool("notes_list_files_by_prefix", {}, ok=False)
            if status == 200:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(body)


async def two_instances(proxy_factory: Any, emulator: Any, tmp_path: Path, url: str,
                        b_extra: list[str] | None = None) -> tuple[ProxyProcess, ProxyProcess]:
    a = await proxy_factory(upstream=emulator.url, state_dir=tmp_path / "a", extra_args=["--store", url])
    b = await proxy_factory(upstream=emulator.url, state_dir=tmp_path / "b",
                            extra_args=["--store", url, *(b_extra or [])])
    return a, b


async def joined(a: ProxyProcess, b: ProxyProcess, emulator: Any, task: str) -> tuple[Instance, Instance]:
    """The task, known to both instances and joined through both proxies (one hello each)."""
    ia, ib = Instance(a, task), Instance(b, task)
    emulator.script(Text("hello A"), Text("hello B"))
    await ia.create([{"role": "user", "content": "hello through A"}])
    await ib.create([{"role": "user", "content": "hello through B"}])
    await ia.knows_task()
    await ib.knows_task()
    return ia, ib


def workers_unsupported() -> str | None:
    from proxy.app.workers import supported

    return supported()


def new_task(state_dir: Path) -> str:
    out = cli("task", "new", "--state-dir", str(state_dir))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def no_note_files(*procs: ProxyProcess) -> None:
    for p in procs:
        notes = p.state_dir / "notes"
        assert not notes.exists() or not [f for f in notes.rglob("*") if f.is_file() and not f.name.startswith(".")]


async def test_a_note_written_through_a_is_read_through_b(emulator, proxy_factory, tmp_path: Path, db_url: str):
    a, b = await two_instances(proxy_factory, emulator, tmp_path, db_url)
    ia, ib = await joined(a, b, emulator, new_task(a.state_dir))
    await ia.tool("notes_write_file", {"path": "plan.md", "text": "step 1: shared through PostgreSQL\n"})
    await ib.tool("notes_append_to_file", {"path": "plan.md", "text": "step 2: appended through B\n"})
    _, read = await ia.tool("notes_read_file", {"path": "plan.md"})
    assert "step 1: shared through PostgreSQL" in read["text"] and "step 2: appended through B" in read["text"]
    _, found = await ib.tool("notes_search_contents", {"query": "appended through"})
    assert "plan.md:2: step 2: appended through B" in found["text"], found
    _, listing = await ib.tool("notes_list_files_by_prefix", {})
    assert "plan.md" in listing["text"]
    no_note_files(a, b)


async def test_new_context_through_a_rolls_over_bs_next_request(emulator, proxy_factory, tmp_path: Path,
                                                                 db_url: str):
    # B runs two proxy workers: each opens its own store, and whichever gets the request takes the mark.
    workers = [] if workers_unsupported() else ["--workers", "2"]
    a, b = await two_instances(proxy_factory, emulator, tmp_path, db_url, b_extra=workers)
    if workers:
        assert len(json.loads((b.state_dir / "run.json").read_text())["workers"]) == 2
    ia, ib = await joined(a, b, emulator, new_task(a.state_dir))
    # The agent's conversation runs through B; the model asks for new_context, which the agent runs through A.
    emulator.script(Response([FunctionCall("new_context", {}, call_id="c_nc")]), Text("resumed in w2"))
    history: list[dict[str, Any]] = [{"role": "user", "content": "do the work in window one"}]
    first = await ib.create(history, tools=[NEW_CONTEXT_SPEC])
    history += [o.model_dump(mode="json", exclude_none=True) for o in first.output]
    _, marked = await ia.tool("new_context", {})
    assert marked["details"]["pending_rollover"] == "new_context", marked
    _, remaining = await ib.tool("get_context_remaining", {})  # B's tool server sees the mark made through A
    assert remaining["details"]["pending_rollover"] == "new_context", remaining
    history.append({"type": "function_call_output", "call_id": "c_nc", "output": marked["text"]})
    await ib.create(history, tools=[NEW_CONTEXT_SPEC])
    forwarded = emulator.responses_requests[-1].input_items
    texts = [text_of(i) for i in forwarded if i.get("role") == "developer"]
    assert any("context window w2" in t and "previous window is w1" in t for t in texts), texts
    assert any(t.startswith("Existing notes for /root at this context-window reset") for t in texts), texts
    assert "do the work in window one" not in orjson.dumps(forwarded).decode()
    _, after = await ia.tool("get_context_remaining", {})  # taken once, by B: nothing pending any more
    assert after["details"]["pending_rollover"] is None, after


async def test_a_checkpoint_asked_of_a_runs_on_bs_next_request(emulator, proxy_factory, tmp_path: Path,
                                                                  db_url: str):
    a, b = await two_instances(proxy_factory, emulator, tmp_path, db_url)
    ia, ib = await joined(a, b, emulator, new_task(a.state_dir))
    emulator.script(Text("first answer"),
                    FunctionCall("notes_write_file", {"path": "cp.md", "text": "checkpoint written through B"},
                                 call_id="c_cp"),
                    Text("resumed in w2"))
    history: list[dict[str, Any]] = [{"role": "user", "content": "do the work in window one"}]
    first = await ib.create(history)  # the agent's conversation runs through B
    history += [o.model_dump(mode="json", exclude_none=True) for o in first.output]
    async with aiohttp.ClientSession() as http, http.post(
            f"{a.tools_url}/v1/context/checkpoint", json={"task": ia.task, "agent": "/root"},
            headers=ia.headers) as r:  # asked of A
        marked = await r.json()
        assert r.status == 200, marked
    assert marked["pending_rollover"] == "checkpoint" and marked["window_id"] == "w1", marked
    _, remaining = await ib.tool("get_context_remaining", {})
    assert remaining["details"]["pending_rollover"] == "checkpoint", remaining
    seen = len(emulator.responses_requests)
    history.append({"role": "user", "content": "continue"})
    resp = await ib.create(history)
    assert resp.output_text == "resumed in w2"
    turn, forwarded = emulator.responses_requests[seen:]
    assert (turn.json or {}).get("tool_choice") == CHECKPOINT_CHOICE  # the turn
    texts = [text_of(i) for i in forwarded.input_items if i.get("role") == "developer"]
    assert any("context window w2" in t for t in texts), texts
    _, read = await ia.tool("notes_read_file", {"path": "cp.md"})  # the turn's note, in the store
    assert "checkpoint written through B" in read["text"]
    _, after = await ia.tool("get_context_remaining", {})  # taken once, by B
    assert after["details"]["pending_rollover"] is None, after
    no_note_files(a, b)
    # `ctproxy context checkpoint` on A's state directory marks in the store A serves from (its run.json's), too.
    out = cli("context", "checkpoint", "--task", ia.task, "--state-dir", str(a.state_dir))
    assert out.returncode == 0, out.stderr
    assert "checkpoint pending for /root" in out.stdout
    _, remaining = await ib.tool("get_context_remaining", {})
    assert remaining["details"]["pending_rollover"] == "checkpoint", remaining


async def test_kill_9_of_a_loses_nothing_committed_and_b_serves_on(emulator, proxy_factory, tmp_path: Path,
                                                                   db_url: str):
    a, b = await two_instances(proxy_factory, emulator, tmp_path, db_url)
    ia, ib = await joined(a, b, emulator, new_task(a.state_dir))
    await ia.tool("notes_write_file", {"path": "committed.md", "text": "written through A before the kill\n"})
    emulator.script(Text("answer through A"))
    await ia.create([{"role": "user", "content": "a turn through A"}])
    assert a.proc is not None
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(30)
    _, read = await ib.tool("notes_read_file", {"path": "committed.md"})
    assert "written through A before the kill" in read["text"]
    emulator.script(Text("B still serves"))
    resp = await ib.create([{"role": "user", "content": "a turn through B after the kill"}])
    assert resp.output_text == "B still serves"
    await ib.tool("notes_append_to_file", {"path": "committed.md", "text": "and B writes on\n"})
    _, again = await ib.tool("notes_read_file", {"path": "committed.md"})
    assert "written through A before the kill" in again["text"] and "and B writes on" in again["text"]


async def test_a_stateless_conversation_alternating_between_a_and_b_is_one_session(emulator, proxy_factory,
                                                                                   tmp_path: Path, db_url: str):
    a, b = await two_instances(proxy_factory, emulator, tmp_path, db_url)
    ia, ib = await joined(a, b, emulator, new_task(a.state_dir))
    emulator.script(Text("one"), Text("two"), Text("three"))
    history: list[dict[str, Any]] = []
    for n, inst in enumerate((ia, ib, ia), 1):
        history.append({"role": "user", "content": f"turn {n} marker-{n}-of-three"})
        resp = await inst.create(list(history))
        history += [o.model_dump(mode="json", exclude_none=True) for o in resp.output]
    # Through B's tool server: every turn's item is in the agent's history, in one window of one session.
    for n in (1, 2, 3):
        body: dict[str, Any] = {}
        for _ in range(100):
            _, body = await ib.tool("history_search_contents", {"query": f"marker-{n}-of-three"})
            if f"marker-{n}-of-three" in body["text"]:
                break
            await asyncio.sleep(0.05)
        assert f"marker-{n}-of-three" in body["text"], (n, body)
    _, windows = await ib.tool("history_list_windows", {})
    assert "w1" in windows["text"] and "w2" not in windows["text"], windows


async def test_a_window_learned_through_a_makes_b_compact_before_it_overflows(proxy_factory, tmp_path: Path,
                                                                             db_url: str):
    import psycopg

    from tests.emulator import Emulator

    limit, message = 60_000, "m" * 3_000  # the upstream's real window (bytes), far below the model table's
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(
            {"remote_compaction": {"enabled": True}, "model_windows": {"gpt-test*": 128_000}}))
    async with Emulator(context_limit_bytes=limit) as emu:
        a, b = await two_instances(proxy_factory, emu, tmp_path, db_url)

        async def create(inst: ProxyProcess, items: list[dict[str, Any]]) -> Any:
            async with openai.AsyncOpenAI(base_url=inst.url + "/v1", api_key="sk-test-store", max_retries=0) as c:
                return await c.responses.create(model="gpt-test-1", store=False, input=items)

        # B serves the model and endpoint first: it has read "no window learned" for them (and keeps that only
        # for LEARNED_WINDOW_FRESH_S, not for its life).
        await create(b, [{"role": "user", "content": "a small first request through B"}])
        emu.reset()
        # Just above the real window: A overflows, compacts, retries smaller, and learns about 63 KB / 4 tokens.
        answer = await create(a, [{"role": "user", "content": f"{i}: {message}"} for i in range(21)])
        assert answer.output_text.startswith("You said: 20: mmm")  # A recovered the overflow
        assert [r.status for r in emu.responses_requests] == [400, 200]
        with psycopg.connect(db_url) as conn:
            (learned,), = conn.execute("SELECT window_tokens FROM compaction_windows WHERE model = 'gpt-test-1'")
            assert 0 < learned <= 66_000 // 4
            events = [tuple(r) for r in conn.execute("SELECT kind, outcome FROM compaction_events ORDER BY id")]
            assert ("recovery", "recovered") in events and ("compaction", "remote") in events, events
        for p in (a, b):  # nothing of compaction's in either state directory's database
            conn_l = sqlite3.connect(p.state_dir / "ctproxy.db")
            try:
                tables = {r[0] for r in conn_l.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                for table in ("compaction_windows", "compaction_events", "compaction_sessions"):
                    if table in tables:
                        assert conn_l.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, (p, table)
            finally:
                conn_l.close()
        # B never saw an overflow: the window A learned makes it compact a new conversation (about 58 KB, under
        # the real window but above the learned window's threshold) before it forwards it, without a restart:
        # once what B read before is older than the documented freshness, B reads the store's again.
        from proxy.windows.compacting import LEARNED_WINDOW_FRESH_S

        await asyncio.sleep(LEARNED_WINDOW_FRESH_S + 0.5)  # (past the bound, never racing it)
        emu.reset()
        answer = await create(b, [{"role": "user", "content": f"other {i}: {message}"} for i in range(19)])
        assert answer.output_text.startswith("You said: other 18")
        assert [r.status for r in emu.responses_requests] == [200]
        assert [r.route for r in emu.requests] == ["compact", "responses"], [(r.route, r.status) for r in emu.requests]


async def test_tasks_and_show_read_the_stores_journal(emulator, proxy_factory, tmp_path: Path, db_url: str):
    a, b = await two_instances(proxy_factory, emulator, tmp_path, db_url)
    ia, _ = await joined(a, b, emulator, new_task(a.state_dir))
    task: dict[str, Any] = {}
    for _ in range(100):  # the journal's writers commit in the background
        out = cli("tasks", "--json", "--state-dir", str(b.state_dir))  # B's run.json names the store
        assert out.returncode == 0, out.stderr
        task = next((t for t in json.loads(out.stdout) if t["task_id"] == ia.task), {})
        if task and task["items"] >= 4:
            break
        await asyncio.sleep(0.1)
    assert [ag["address"] for ag in task["agents"]] == ["/root"], task
    assert task["sessions"] >= 1 and task["items"] >= 4, task  # the turns through A and through B
    shown = cli("show", ia.task, "--state-dir", str(b.state_dir))
    assert shown.returncode == 0, shown.stderr
    assert "hello through A" in shown.stdout and "hello through B" in shown.stdout, shown.stdout
    listed = json.loads(cli("show", ia.task, "--json", "--state-dir", str(a.state_dir)).stdout)
    item = next(i for entry in listed for i in entry["item_list"] if "hello through B" in i["preview"])
    one = cli("show", "x", "--item", item["item_id"], "--json", "--state-dir", str(a.state_dir))
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["raw"]["content"] == "hello through B"
    prefix = cli("show", ia.task[:12], "--state-dir", str(a.state_dir))  # a unique prefix resolves
    assert prefix.returncode == 0 and "hello through A" in prefix.stdout, prefix.stderr
    embedded = cli("tasks", "--json", "--store", "embedded", "--state-dir", str(b.state_dir))
    assert embedded.returncode == 0 and ia.task not in embedded.stdout  # B's own database has none of it


async def test_an_unreachable_store_stops_up_with_what_to_do(tmp_path: Path, pg: PrivateServer):
    url = f"postgresql://ctproxy:s3cret-pw@127.0.0.1:{pg.port}/no_such_database"
    p = ProxyProcess(tmp_path / "state", extra_args=["--store", url])
    with pytest.raises(RuntimeError) as exc:
        await p.astart()
    out = str(exc.value)
    assert p.proc is not None and p.proc.returncode == 1, out
    assert "postgresql://ctproxy@127.0.0.1" in out and "cannot be reached" in out, out
    assert "--store embedded" in out and "s3cret-pw" not in out, out
    assert not (tmp_path / "state" / "run.json").exists()  # nothing started, nothing announced
    # Nothing listens on the port at all: the same, by the environment this time.
    from tests.support.ports import closed_port

    with closed_port() as port:
        refused = ProxyProcess(tmp_path / "state2",
                               env={"CTPROXY_STORE": f"postgresql://ctproxy:s3cret-pw@127.0.0.1:{port}/x"})
        with pytest.raises(RuntimeError) as exc2:
            await refused.astart()
    out2 = str(exc2.value)
    assert refused.proc is not None and refused.proc.returncode == 1, out2
    assert "(from CTPROXY_STORE) cannot be reached" in out2 and "s3cret-pw" not in out2, out2
    assert not (tmp_path / "state2" / "run.json").exists()


async def test_status_names_the_store_without_its_password(emulator, proxy_factory, tmp_path: Path, db_url: str,
                                                           pg: PrivateServer):
    with_pw = db_url.replace("ctproxy@", "ctproxy:ignored-pw@")  # trust auth: the password is not checked
    state = tmp_path / "s"
    set_out = cli("config", "set", "store.url", with_pw, "--state-dir", str(state))
    assert set_out.returncode == 0, set_out.stderr
    proc = await proxy_factory(upstream=emulator.url, state_dir=state)  # the store from the config file
    public = db_url  # postgresql://ctproxy@127.0.0.1:PORT/DB
    assert f"store        {public}" in proc.log() and "ignored-pw" not in proc.log()
    run = (state / "run.json").read_text()
    assert "ignored-pw" not in run and json.loads(run)["store"] == {"kind": "postgresql", "url": public,
                                                                  "source": "store.url"}
    status = cli("status", "--state-dir", str(state))
    assert f"store:     {public} (from store.url)  reachable" in status.stdout, status.stdout
    assert "dashboard" not in status.stdout.split("store:", 1)[1].splitlines()[0]  # the dashboard is the store's
    assert "ignored-pw" not in status.stdout
    st = json.loads(cli("status", "--json", "--state-dir", str(state)).stdout)
    assert st["store"]["reachable"] is True and st["store"]["url"] == public
    # The flag wins over the environment, which wins over the config.
    env_proc = await proxy_factory(upstream=emulator.url, state_dir=tmp_path / "e",
                                   env={"CTPROXY_STORE": db_url}, extra_args=["--store", "embedded"])
    assert json.loads((env_proc.state_dir / "run.json").read_text())["store"]["source"] == "--store"
    env_only = await proxy_factory(upstream=emulator.url, state_dir=tmp_path / "f", env={"CTPROXY_STORE": db_url})
    assert json.loads((env_only.state_dir / "run.json").read_text())["store"] == {
        "kind": "postgresql", "url": public, "source": "CTPROXY_STORE"}
    # The database goes away (dropped, its connections ended): status says so.
    import psycopg

    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {db_url.rsplit('/', 1)[1]} WITH (FORCE)")
    down = cli("status", "--state-dir", str(state))
    assert "NOT reachable" in down.stdout and "ignored-pw" not in down.stdout, down.stdout


async def test_bs_dashboard_api_shows_what_was_journaled_through_a(emulator, proxy_factory, tmp_path: Path,
                                                                  db_url: str):
    from proxy.app.journal_views import tasks_report
    from proxy.state import StateDir
    from proxy.store.pg import PostgresStore

    a, b = await two_instances(proxy_factory, emulator, tmp_path, db_url)
    ia = Instance(a, new_task(a.state_dir))
    emulator.script(Text("answered through A"))
    await ia.create([{"role": "user", "content": "dashboard-marker said through A only"}])
    token_b = (b.state_dir / "token").read_text().strip()
    hdrs = {"Authorization": f"Bearer {token_b}"}
    async with aiohttp.ClientSession() as http:

        async def api(path: str) -> Any:
            async with http.get(f"{b.tools_url}/ui/api/{path}", headers=hdrs) as r:
                assert r.status == 200, await r.text()
                return await r.json()

        task: dict[str, Any] = {}
        for _ in range(100):  # the journal's writer commits in the background
            task = next((t for t in (await api("tasks"))["data"] if t["task_id"] == ia.task), {})
            if task and task["items"] >= 2:
                break
            await asyncio.sleep(0.1)
        assert task and task["items"] >= 2, task  # the user's message and the answer, journaled through A
        assert [ag["address"] for ag in task["agents"]] == ["/root"], task
        key = task["agents"][0]["sessions"][0]["session_key"]
        session = await api(f"sessions/{key}")
        previews = [i["preview"] for i in session["items"]]
        assert "dashboard-marker said through A only" in previews and "answered through A" in previews, previews
        item = next(i for i in session["items"] if i["preview"].startswith("dashboard-marker"))
        raw = await api(f"items/{item['item_id']}")
        assert raw["raw"]["content"] == "dashboard-marker said through A only", raw
    # B's own state directory's database has none of it; the report through the store has it.
    embedded = cli("tasks", "--json", "--store", "embedded", "--state-dir", str(b.state_dir))
    assert embedded.returncode == 0 and ia.task not in embedded.stdout
    store = PostgresStore.open(db_url)
    try:
        report = tasks_report(StateDir.open(b.state_dir), store)
    finally:
        store.close()
    assert f"task {ia.task}" in report and f"session {key}" in report, report


async def test_a_sub_agent_joined_through_a_is_known_to_bs_codex_routes(emulator, proxy_factory, tmp_path: Path,
                                                                       db_url: str):
    import psycopg

    a, b = await two_instances(proxy_factory, emulator, tmp_path, db_url)
    task = new_task(a.state_dir)
    emulator.script(Text("root here"), Text("worker here"))
    await Instance(a, task).create([{"role": "user", "content": "the root's turn through A"}])
    await Instance(a, task, "/root/worker").create([{"role": "user", "content": "the worker's turn through A"}])
    for _ in range(200):  # the journal's writer commits in the background
        with psycopg.connect(db_url) as conn:
            if conn.execute("SELECT 1 FROM journal_agents WHERE task_id = %s AND address = '/root/worker'",
                            (task,)).fetchone():
                break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the store's journal never registered /root/worker")
    # A Codex call to B's backend route, as the worker (Codex's context names it; no x-ctp-agent): B resolves the
    # worker through the store's journal, so the note is the worker's.
    token_b = (b.state_dir / "token").read_text().strip()
    body = {"path": "codex.md", "text": "written by the worker through B's Codex route\n",
            "context": {"session_id": "codex-session-two-instances", "current_agent_name": "/root/worker"}}
    async with aiohttp.ClientSession() as http, http.post(
            f"{b.tools_url}/v1/alpha/notes/v2/write_file", json=body,
            headers={"Authorization": f"Bearer {token_b}", "x-ctp-task": task}) as r:
        answer = await r.json(content_type=None)
        assert r.status == 200 and answer.get("ok") is True, answer
    _, read = await Instance(a, task, "/root/worker").tool("notes_read_file", {"path": "codex.md"})
    assert "written by the worker through B's Codex route" in read["text"], read


async def _store_round_trips(proc: ProxyProcess) -> int:
    """The proxy's round trips to the store on the request path (`ctproxy_store_round_trips_total{path="request"}`,
    proxy/store/pgconn.py), once two reads in a row agree (the answer's last writes are awaited by the proxy)."""
    token = (proc.state_dir / "token").read_text().strip()
    last = None
    async with aiohttp.ClientSession() as http:
        for _ in range(100):
            async with http.get(proc.tools_url + "/metrics", headers={"Authorization": f"Bearer {token}"}) as r:
                text = await r.text()
            lines = [ln for ln in text.splitlines() if ln.startswith('ctproxy_store_round_trips_total{path="request"}')]
            assert lines, text[-2000:]
            now = sum(int(float(ln.rsplit(" ", 1)[1])) for ln in lines)
            if now == last:
                return now
            last = now
            await asyncio.sleep(0.3)
    raise AssertionError("the store's round-trip count never settled")


async def test_a_known_sessions_request_costs_few_store_round_trips(emulator, proxy_factory, tmp_path: Path,
                                                                    db_url: str):
    """Per request of a known session on PostgreSQL, the request path (the proxy's stages, the usage of the answer)
    waits for at most a few round trips: the stored usage is read once per request, not once per stage that asks
    (proxy/usage.py), and a statement alone is one round trip, not BEGIN + statement + COMMIT
    (proxy/store/pgconn.py). The journal's writer commits off the request path and is not counted here."""
    proc = await proxy_factory(upstream=emulator.url, state_dir=tmp_path / "a", extra_args=["--store", db_url])
    inst = Instance(proc, new_task(proc.state_dir))
    warm, turns = 2, 6
    emulator.script(*[Text(f"answer {n}") for n in range(warm + turns)])
    history: list[dict[str, Any]] = []

    async def turn(n: int) -> None:
        history.append({"role": "user", "content": f"turn {n}"})
        resp = await inst.create(list(history))
        history.extend(o.model_dump(mode="json", exclude_none=True) for o in resp.output)

    for n in range(warm):  # the session exists, its first usage is stored
        await turn(n)
    before = await _store_round_trips(proc)
    for n in range(warm, warm + turns):
        await turn(n)
    per_request = (await _store_round_trips(proc) - before) / turns
    print(f"store round trips per request (request path): {per_request:.2f}")
    assert per_request <= 7, per_request  # 33 before session 14: 4 usage reads, BEGIN + COMMIT around each
