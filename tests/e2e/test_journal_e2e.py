"""End to end: the `openai` SDK through a real mitmproxy process with the journal, against the emulator.

The proxy is `mitmdump -s addons/session.py -s addons/tap.py -s addons/history.py` in reverse mode
(the addons loaded alone, as DESIGN §2 promises), so streaming is passed through by the tap and the
journal sees exactly what a client sends. A second test kills that process with SIGKILL in the
middle of a 200-turn run and checks the database it leaves behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import APIConnectionError, AsyncOpenAI

from tests.emulator import Emulator, FunctionCall, Reasoning, Response, Text
from tests.support.ports import listening_port

REPO = Path(__file__).resolve().parents[2]
MITMDUMP = Path(sys.executable).parent / "mitmdump"


class Mitmdump:
    """The journal's addons in a real mitmproxy process."""

    def __init__(self, state: Path, upstream: str, log: Path):
        self.state, self.upstream, self.log = state, upstream, log
        self.port = 0  # bound by mitmdump itself, read back once it listens
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Mitmdump:
        args = [str(MITMDUMP), "--mode", f"reverse:{self.upstream}", "--listen-host", "127.0.0.1",
                "--listen-port", "0", "-q",
                "-s", str(REPO / "addons/session.py"), "-s", str(REPO / "addons/tap.py"),
                "-s", str(REPO / "addons/history.py"), "--set", f"ctp_state_dir={self.state}"]
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(args, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO, env=env)
        try:
            self.port = listening_port(self.proc, what="mitmdump")
        except RuntimeError as e:
            raise RuntimeError(f"{e}:\n" + self.log.read_text(errors="replace")) from None
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def proxy_factory(tmp_path: Path) -> Iterator:
    procs: list[Mitmdump] = []

    def make(upstream: str) -> Mitmdump:
        p = Mitmdump(tmp_path / "state", upstream, tmp_path / f"mitmdump{len(procs)}.log").start()
        procs.append(p)
        return p

    yield make
    for p in procs:
        p.stop(signal.SIGKILL)


def db(state: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(state / "ctproxy.db")
    conn.row_factory = sqlite3.Row
    return conn


def dump(items) -> list[dict]:
    return [i.model_dump(exclude_none=True) for i in items]


async def create(client: AsyncOpenAI, stream: bool, input_items: list[dict]):
    if not stream:
        return await client.responses.create(model="gpt-5", input=input_items)
    final = None
    async with await client.responses.create(model="gpt-5", input=input_items, stream=True) as events:
        async for ev in events:
            if ev.type == "response.completed":
                final = ev.response
    assert final is not None
    return final


async def test_sdk_conversation_is_journaled_once_per_branch(proxy_factory, tmp_path: Path):
    async with Emulator() as emu:
        proxy = await asyncio.to_thread(proxy_factory, emu.url)
        client = AsyncOpenAI(base_url=proxy.base_url, api_key="sk-test", max_retries=0)
        emu.script(
            Response([Reasoning(summary="look it up"), FunctionCall("get_weather", {"city": "Paris"},
                                                                    call_id="call_w")]),
            Text("It is sunny in Paris.", deltas=4),
            Text("You're welcome."),
            Text("You're very welcome!"),
        )
        history: list[dict] = [{"role": "user", "content": "Weather in Paris?"}]
        r1 = await create(client, False, history)
        history += dump(r1.output)
        history.append({"type": "function_call_output", "call_id": "call_w", "output": '{"sky":"clear"}'})
        r2 = await create(client, True, history)
        history += dump(r2.output)
        r3 = await create(client, False, [*history, {"role": "user", "content": "thanks"}])
        edited = [*history, {"role": "user", "content": "thanks, really"}]  # the user edits the last turn
        r4 = await create(client, True, edited)
        await client.close()
        await asyncio.to_thread(proxy.stop)  # SIGTERM: the done hook flushes the journal
    conn = db(tmp_path / "state")
    items = conn.execute("SELECT item_id, type, role, text, upstream_id, response_id, tool_namespace, tool_name,"
                         " origin FROM journal_items ORDER BY seq").fetchall()
    texts = [(r["origin"], r["type"], r["role"], r["text"]) for r in items]
    assert texts == [
        ("input", "message", "user", "Weather in Paris?"),
        ("output", "reasoning", "assistant", "[reasoning: content not recorded as text]"),
        ("output", "function_call", "assistant", '[call get_weather]\n{"city":"Paris"}'),
        ("input", "function_call_output", "tool", '{"sky":"clear"}'),
        ("output", "message", "assistant", "It is sunny in Paris."),
        ("input", "message", "user", "thanks"),
        ("output", "message", "assistant", "You're welcome."),
        ("input", "message", "user", "thanks, really"),
        ("output", "message", "assistant", "You're very welcome!"),
    ]  # every item exactly once, although the client resent the history four times
    by_text = {r["text"]: r for r in items}
    call = by_text['[call get_weather]\n{"city":"Paris"}']
    assert call["upstream_id"] == r1.output[1].id and call["response_id"] == r1.id
    assert (by_text['{"sky":"clear"}']["tool_namespace"], by_text['{"sky":"clear"}']["tool_name"]) == \
        ("functions", "get_weather")
    branch = [r[0] for r in conn.execute("SELECT item_id FROM journal_branch ORDER BY pos")]
    ids = [r["item_id"] for r in items]
    assert branch == ids[:5] + ids[7:]  # the edited branch is current ...
    heads = conn.execute("SELECT head_item_id FROM journal_branch_heads").fetchall()
    assert [h[0] for h in heads] == [ids[6]]  # ... and the first one is kept, with its head archived
    responses = {r["response_id"]: r for r in conn.execute("SELECT * FROM journal_responses")}
    assert set(responses) == {r1.id, r2.id, r3.id, r4.id}
    assert all(r["usage"] and not r["incomplete"] for r in responses.values())
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


async def test_sigkill_mid_run_keeps_every_item_of_committed_responses(proxy_factory, tmp_path: Path):
    """200 streamed turns; the proxy is killed with SIGKILL after about half of them. The database must
    open cleanly, and the committed responses must be a prefix of what the client received, each with
    all its items (and its request's input)."""
    async with Emulator(max_recorded=10) as emu:
        proxy = await asyncio.to_thread(proxy_factory, emu.url)
        client = AsyncOpenAI(base_url=proxy.base_url, api_key="sk-test", max_retries=0)
        history: list[dict] = []
        received: list[tuple[str, list[str], str]] = []  # (response id, output texts, the user message)
        kill_after = 100 + int.from_bytes(os.urandom(1)) % 40

        for turn in range(200):
            emu.script(Text(f"answer {turn}", deltas=2))
            question = f"question {turn}"
            history.append({"role": "user", "content": question})
            try:
                resp = await create(client, True, history)
            except APIConnectionError:
                break
            history += dump(resp.output)
            received.append((resp.id, [c.text for o in resp.output for c in o.content], question))
            if len(received) == kill_after:
                await asyncio.sleep(int.from_bytes(os.urandom(1)) / 255 * 0.03)  # anywhere in a batch
                os.kill(proxy.proc.pid, signal.SIGKILL)
        await client.close()
    assert kill_after <= len(received) < 200
    conn = db(tmp_path / "state")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    committed = {r[0] for r in conn.execute("SELECT response_id FROM journal_responses")}
    in_order = [rid in committed for rid, _, _ in received]
    last = max((i for i, ok in enumerate(in_order) if ok), default=-1)
    assert last >= 0 and all(in_order[: last + 1])  # a prefix: nothing missing before the last commit
    lost = len(received) - (last + 1)
    assert lost <= 10, f"{lost} fully received responses were not committed"
    texts = {r[0] for r in conn.execute("SELECT text FROM journal_items")}
    for rid, outputs, question in received[: last + 1]:
        n = conn.execute("SELECT item_count FROM journal_responses WHERE response_id=?", (rid,)).fetchone()[0]
        stored = conn.execute("SELECT count(*) FROM journal_items WHERE response_id=?", (rid,)).fetchone()[0]
        assert n == stored == 1
        assert question in texts and all(t in texts for t in outputs)
    # The branch manifest is consistent with the committed items.
    orphans = conn.execute("SELECT count(*) FROM journal_branch b LEFT JOIN journal_items i ON i.item_id=b.item_id"
                           " WHERE i.item_id IS NULL").fetchone()[0]
    assert orphans == 0
    print(f"received {len(received)} responses, {last + 1} committed, {lost} lost at SIGKILL")


async def test_ctproxy_up_journals_and_its_tool_server_reads_it(tmp_path: Path):
    import aiohttp

    from proxy.state import StateDir
    from tests.support.proxyproc import ProxyProcess

    async with Emulator() as emu:
        proxy = await ProxyProcess(tmp_path / "state", upstream=emu.url).astart()
        try:
            client = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
            emu.script(Text("first answer"), Text("second answer"))
            history: list[dict] = [{"role": "user", "content": "first question"}]
            r1 = await create(client, True, history)
            history += [*dump(r1.output), {"role": "user", "content": "second question"}]
            await create(client, False, history)
            before = len(emu.responses_requests)
            refused = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0,
                                  default_headers={"x-ctp-task": "task_does_not_exist"})
            with pytest.raises(Exception) as err:
                await refused.responses.create(model="gpt-5", input="hi")
            assert getattr(err.value, "status_code", None) == 400 and "unknown task" in str(err.value)
            assert err.value.body["code"] == "unknown_task"
            assert len(emu.responses_requests) == before  # never forwarded
            await client.close()
            await refused.close()
            conn = db(tmp_path / "state")
            deadline = time.monotonic() + 10
            while conn.execute("SELECT count(*) FROM journal_items").fetchone()[0] < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            task = conn.execute("SELECT task_id FROM journal_tasks").fetchone()[0]
            token = StateDir.open(tmp_path / "state").token()
            async with aiohttp.ClientSession() as http, http.post(
                    f"{proxy.tools_url}/v1/tools/history_search_contents", json={"query": "answer"},
                    headers={"Authorization": f"Bearer {token}", "x-ctp-task": task}) as resp:
                body = await resp.json()
            assert resp.status == 200 and body["ok"], body
            assert [json_line["item_id"] for json_line in map(_json, body["text"].splitlines()[1:])]
        finally:
            await proxy.astop()


def _json(line: str) -> dict:
    import json

    return json.loads(line)
