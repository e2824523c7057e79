"""`ctproxy up --workers N` (issue 32, docs/adr/0012-proxy-workers.md), through the real CLI against the
emulator: both workers serve one listen address, a conversation whose turns land on different workers is one
session in the journal, a worker killed with -9 is restarted while the other serves, `ctproxy status` lists
the workers, `/metrics` sums them and the request log names them."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from proxy.app.telemetry import sum_metrics
from proxy.app.workers import supported
from proxy.config import Config, ProxyConfig
from tests.emulator import FunctionCall, Text

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(supported() is not None, reason=str(supported()))


def _status(state: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "proxy.app.cli", "status", "--json", "--state-dir", str(state)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    return json.loads(out.stdout)


def _gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie whose sockets are closed)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _workers_of(log: str, session: str) -> set[str]:
    return set(re.findall(rf"session={re.escape(session)} worker=(\d+)", log))


async def _turn(url: str, history: list[dict], n: int) -> str:
    """One turn on a fresh connection (the kernel picks a worker per connection); the answer's text."""
    history.append({"role": "user", "content": f"question {n}"})
    body = {"model": "gpt-5", "input": history, "stream": n % 2 == 0}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http, \
            http.post(url + "/v1/responses", json=body, headers={"Authorization": "Bearer sk-test"}) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.read()
    if body["stream"]:
        done = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
        response = next(e["response"] for e in done if e.get("type") == "response.completed")
    else:
        response = json.loads(raw)
    text = response["output"][-1]["content"][0]["text"]
    history.append({"role": "assistant", "content": [{"type": "output_text", "text": text}]})
    return text


async def _wait_for(cond, bound: float = 60.0) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.1)
    return cond()


async def test_two_workers_serve_one_address_and_journal_one_session(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--workers", "2"])
    run = _status(proxy.state_dir)["proxy"]
    workers = run["workers"]
    assert [w["index"] for w in workers] == [1, 2]
    pids = {w["pid"] for w in workers}
    assert len(pids) == 2 and proxy.proc.pid not in pids and run["pid"] == proxy.proc.pid
    assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    text = subprocess.run([sys.executable, "-m", "proxy.app.cli", "status", "--state-dir", str(proxy.state_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=120).stdout
    assert "workers:   2" in text and all(f"pid {pid}" in text for pid in pids)

    # A stateless conversation, one connection per turn, until both workers have served some of its turns.
    history: list[dict] = []
    answers: list[str] = []
    session = None
    for n in range(60):
        answers.append(await _turn(proxy.url, history, n))
        if session is None:
            await _wait_for(lambda: "session=" in proxy.log())
            session = re.search(r"session=(\S+)", proxy.log())[1]
        if n >= 5 and await _wait_for(lambda s=session: len(_workers_of(proxy.log(), s)) == 2, 2.0):
            break
    turns = len(answers)
    assert _workers_of(proxy.log(), session) == {"1", "2"}, proxy.log()

    # /metrics on the tool server: both workers' requests, summed. A worker counts a request when its flow ends,
    # which can come just after the client read the answer: wait for the count, not a moment.
    token = (proxy.state_dir / "token").read_text().strip()

    async def served_and_text() -> tuple[float, str]:
        async with aiohttp.ClientSession() as http, \
                http.get(proxy.tools_url + "/metrics", headers={"Authorization": f"Bearer {token}"}) as resp:
            text = await resp.text()
        found = re.findall(r'^ctproxy_requests_total\{[^}]*route="responses"[^}]*\} (\S+)', text, re.M)
        return sum(float(v) for v in found), text

    deadline = time.monotonic() + 60
    served, metrics = await served_and_text()
    while served < turns and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        served, metrics = await served_and_text()
    assert "ctproxy_proxy_workers 2" in metrics
    assert served == turns, metrics

    assert await proxy.astop() == 0  # SIGTERM: every worker flushes its journal, then the supervisor ends
    assert all(_gone(pid) for pid in pids)
    conn = sqlite3.connect(proxy.state_dir / "ctproxy.db")
    assert conn.execute("SELECT count(*) FROM journal_sessions").fetchone()[0] == 1
    texts = [r[0] for r in conn.execute("SELECT i.text FROM journal_branch b JOIN journal_items i"
                                        " ON i.item_id = b.item_id ORDER BY b.pos")]
    assert texts == [t for n in range(turns) for t in (f"question {n}", answers[n])]
    assert conn.execute("SELECT count(*) FROM journal_items").fetchone()[0] == 2 * turns  # each item once


async def test_a_killed_worker_is_restarted_and_the_other_keeps_serving(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--workers", "2"])
    before = {w["index"]: w["pid"] for w in _status(proxy.state_dir)["proxy"]["workers"]}
    os.kill(before[1], signal.SIGKILL)
    # A connection the kernel hands the worker as it dies is reset (its socket is torn down just after it
    # exits): from when the supervisor has seen it exit, the other worker answers everything.
    assert await _wait_for(lambda: "exited with signal 9" in proxy.log(), 30), proxy.log()
    # Served meanwhile: every request answered by the worker left.
    for n in range(6):
        try:
            await _turn(proxy.url, [], n)
        except aiohttp.ClientError as exc:
            raise AssertionError(f"turn {n}: {exc!r}\n{proxy.log()}") from exc

    def restarted() -> dict | None:
        ws = {w["index"]: w for w in _status(proxy.state_dir)["proxy"]["workers"]}
        return ws if ws[1]["pid"] != before[1] and ws[1]["restarts"] == 1 else None

    assert await _wait_for(lambda: restarted() is not None, 90), proxy.log()
    after = restarted()
    assert after[2]["pid"] == before[2] and Path(f"/proc/{after[1]['pid']}").exists()
    assert re.search(r"worker 1 \(pid \d+\) exited with signal 9; restarting", proxy.log())
    assert _gone(before[1])
    # The new worker serves too.
    seen: set[str] = set()
    for n in range(60):
        await _turn(proxy.url, [], 100 + n)
        await asyncio.sleep(0.05)
        seen = set(re.findall(r"worker=(\d+)", proxy.log().split("restarting", 1)[1]))
        if seen == {"1", "2"}:
            break
    assert seen == {"1", "2"}


async def test_ctrl_c_stops_every_worker(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--workers", "2"])
    pids = [w["pid"] for w in _status(proxy.state_dir)["proxy"]["workers"]]
    assert await proxy.astop(signal.SIGINT) == 0
    assert all(_gone(pid) for pid in pids)
    assert not (proxy.state_dir / "run.json").exists()
    assert "ctproxy stopped" in proxy.log()


def test_workers_config_accepts_a_count_or_auto():
    assert Config().proxy.workers == 1 and Config().proxy.worker_count() == 1
    assert ProxyConfig(workers="auto").worker_count() == len(os.sched_getaffinity(0))
    assert ProxyConfig(workers=3).worker_count() == 3
    with pytest.raises(ValueError):
        ProxyConfig(workers=0)


def test_metrics_of_several_workers_are_summed():
    from prometheus_client.parser import text_string_to_metric_families

    from proxy.metrics import Observed, ProxyMetrics

    one, two = ProxyMetrics(), ProxyMetrics()
    for m, n in ((one, 3), (two, 4)):
        for _ in range(n):
            m.observe_request(Observed("responses", "POST", 200, 0.05, 0.01, 100, 1000))
        m.rollover("notes")
    two.observe_request(Observed("other", "GET", 404, 0.001, None, 0, 10))
    text = sum_metrics([one.render(), two.render()]).decode()

    def value(name: str, **labels: str) -> float:
        return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                    if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("ctproxy_requests_total", route="responses", status="200") == 7
    assert value("ctproxy_requests_total", route="other", status="404") == 1
    assert value("ctproxy_request_duration_seconds_count", route="responses") == 7
    assert value("ctproxy_request_duration_seconds_bucket", route="responses", le="0.05") == 7
    assert value("ctproxy_request_duration_seconds_sum", route="responses") == pytest.approx(0.35)
    assert value("ctproxy_rollovers_total", strategy="notes") == 2
    assert value("ctproxy_journal_writer_backlog") == 0


async def test_new_context_and_credentials_reach_whichever_worker_serves(emulator, proxy_factory, monkeypatch):
    """A note written and `new_context` marked through the one tool server roll over the agent's next request,
    whichever worker it lands on (each request on a new connection); an agent's credentials handed over by a
    worker serve the tool server's image call."""
    from proxy.app.journal_views import new_task
    from proxy.state import StateDir
    from tests.e2e.test_credentials_e2e import API_KEY, PROMPT
    from tests.emulator.images import png_bytes
    from tests.proxy.windows.test_context_rollover import assert_bootstrap, old_items_absent, start

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    agent = await start(emulator, proxy_factory, ["--workers", "2", "--enable", "image_generation"])
    emulator.script(FunctionCall("notes_write_file", {"path": "checkpoint.md", "text": "checkpoint: half done"},
                                 call_id="c_w"),
                    FunctionCall("new_context", {}, call_id="c_nc"), Text("resumed"))
    resp = await agent.sample({"role": "user", "content": "do the work"})
    resp = await agent.sample(*await agent.run_calls(resp))
    await agent.sample(*await agent.run_calls(resp))
    third = emulator.responses_requests[2].input_items
    assert_bootstrap(third, "/root/notes/checkpoint.md")
    old_items_absent(third)

    proxy = agent.proxy
    state = StateDir.open(proxy.state_dir)
    task = new_task(state)
    headers = {"Authorization": f"Bearer {state.token()}", "x-ctp-task": task}
    body: dict = {}
    for n in range(4):  # new connections: both workers hand the task's credentials over, most likely
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http, \
                http.post(f"{proxy.url}/v1/responses", json={"model": "gpt-5", "input": f"hello {n}"},
                          headers={"Authorization": f"Bearer {API_KEY}", "x-ctp-task": task}) as r:
            assert r.status == 200, await r.text()
    async with aiohttp.ClientSession() as http, asyncio.timeout(60):
        while True:
            async with http.post(f"{proxy.tools_url}/v1/tools/openai_generate_image", json={"prompt": PROMPT},
                                 headers=headers) as r:
                body = await r.json()
            if body.get("ok") or body.get("details", {}).get("error") != "no_credentials":
                break
            await asyncio.sleep(0.1)
    assert body["ok"] and body["details"]["credential_source"] == "session", body
    import base64

    assert base64.b64decode(body["images"][0]["data"]) == png_bytes()


def test_the_compaction_memo_remembers_nothing_in_a_worker():
    """Another worker may write the session's compaction state: a worker reads it from the database each time."""
    from proxy.windows.remote.store import SessionMemo, SessionRecord

    record = SessionRecord.__new__(SessionRecord)
    alone, worker = SessionMemo(shared=False), SessionMemo(shared=True)
    for memo in (alone, worker):
        memo.put("s", record)
    assert alone.get("s") is record and worker.get("s") is None


def test_a_workers_usage_cache_sees_the_usage_another_worker_recorded(tmp_path):
    """The context budget (reminders, the threshold fence) reads the session's last usage: in a worker, the
    newer of its own and the one another worker committed."""
    from proxy.db import connect
    from proxy.usage import UsageCache, make_usage, record_usage

    db = tmp_path / "ctproxy.db"
    conn = connect(db)
    mine = make_usage("s", "t", "/root", "gpt-5", {"input_tokens": 10, "output_tokens": 1}, "resp_1")
    alone, worker = UsageCache(), UsageCache(db_path=db)
    for cache in (alone, worker):
        cache.put(mine)
    assert worker.get("s") == mine  # nothing newer stored yet
    record_usage(conn, "s", "t", "/root", "gpt-5", {"input_tokens": 900, "output_tokens": 50}, "resp_2",
                 mine.updated_at + 1)  # the next answer, through the other worker
    conn.close()
    assert alone.get("s") == mine
    theirs = worker.get("s")
    assert theirs is not None and (theirs.input_tokens, theirs.response_id) == (900, "resp_2")
    assert worker.get("unknown") is None
