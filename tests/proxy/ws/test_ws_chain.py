"""The Responses WebSocket through ctproxy (issue 28): a plain aiohttp `ws_connect` client, `ctproxy up` as a
real process, the emulator upstream speaking WebSocket mode. Each `response.create` runs through the chain
(journal, bridge, request log) and goes upstream over ctproxy's own socket."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import orjson
import pytest

from tests.emulator import Emulator, FunctionCall, Text
from tests.openapi_schema import spec_available
from tests.support.cli import ctproxy

pytestmark = pytest.mark.timeout(180)

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
BETA = {"OpenAI-Beta": "responses_websockets=2026-02-06", "Authorization": "Bearer sk-test-ws"}


def user(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]


async def turn(ws: aiohttp.ClientWebSocketResponse, body: dict[str, Any] | str) -> list[str]:
    await ws.send_str(body if isinstance(body, str) else orjson.dumps({"type": "response.create", **body}).decode())
    frames: list[str] = []
    while True:
        msg = await ws.receive(timeout=60)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        frames.append(msg.data)
        if orjson.loads(msg.data)["type"] in TERMINAL:
            return frames


def events(frames: list[str]) -> list[dict[str, Any]]:
    return [orjson.loads(f) for f in frames]


async def wait_for(cond, what: str, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.05)


async def test_two_creates_chained_on_one_connection_run_through_the_chain(proxy_factory, tmp_path) -> None:
    async with Emulator(validate_requests=spec_available()) as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url)
        emu.script(Text("first answer"), Text("second answer"))
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            first = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("hello over ws")}))
            assert first[-1]["type"] == "response.completed", first[-1]
            rid = first[-1]["response"]["id"]
            second = events(await turn(ws, {"model": "gpt-5", "store": False, "previous_response_id": rid,
                                            "input": user("and again")}))
            assert second[-1]["type"] == "response.completed", second[-1]
            assert second[-1]["response"]["output"][0]["content"][0]["text"] == "second answer"
        creates = [r for r in emu.requests if r.transport == "ws"]
        assert len(creates) == 2 and creates[0].ws_connection == creates[1].ws_connection == 1
        assert all(r.status == 200 for r in creates)
        assert not [r for r in emu.requests if r.transport == "http"], "nothing fell back to HTTP"
        upgrade = dict(emu.ws_upgrades[0])
        assert upgrade["OpenAI-Beta"] == "responses_websockets=2026-02-06"
        assert upgrade.get("Authorization") == "Bearer sk-test-ws"  # trusted upstream: the credential rule says so
        assert "x-ctproxy-ws" not in {k.lower() for k in upgrade}
        assert creates[1].json.get("stream") is None, "the chain's stream flag never reaches the socket"
        # The journal holds the session: both user texts, both answers.
        await wait_for(lambda: proxy.log_path.read_bytes().count(b"ctproxy-request POST /v1/responses") >= 2, "log")
        tasks = orjson.loads(await asyncio.to_thread(_tasks, proxy))
        sessions = [s for t in tasks for a in t["agents"] for s in a["sessions"]]
        assert len(sessions) == 1 and sessions[0]["items"] == 4 and sessions[0]["responses"] == 2, tasks
        assert "hello over ws" in tasks[0]["label"]
        log = proxy.log()
        lines = [ln for ln in log.splitlines() if "ctproxy-request POST /v1/responses" in ln]
        assert len(lines) == 2 and all("transport=ws" in ln for ln in lines), log[-2000:]
        assert "/ctp-ws" not in log, "a connection's key never shows in the log"


def _tasks(proxy) -> str:

    res = ctproxy("tasks", "--state-dir", str(proxy.state_dir), "--json", timeout=60)
    return res.stdout + res.stderr


async def test_every_stage_off_frames_pass_byte_for_byte(proxy_factory) -> None:
    async with Emulator() as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url, extra_args=["--disable", "all"])
        create = '{"type":"response.create","model":"gpt-5","input":"hi","x_unknown":{"keep":[1,2]},"store":false}'
        emu.script(Text("same bytes"))
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            frames = await turn(ws, create)
        assert emu.requests[-1].raw_body == create.encode(), "the create reached the upstream byte for byte"
        # …and the upstream's frames reached the client as the upstream sent them.
        assert frames == emu.requests[-1].extra["frames"]


async def test_a_bad_frame_gets_an_error_event_and_the_connection_stays_usable(proxy_factory) -> None:
    async with Emulator() as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url)
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            await ws.send_str("{this is not json")
            bad = orjson.loads((await ws.receive(timeout=60)).data)
            assert bad["type"] == "error" and bad["error"]["code"] == "invalid_json"
            ok = events(await turn(ws, {"model": "gpt-5", "input": user("still there?")}))
            assert ok[-1]["type"] == "response.completed"
            # An unknown message passes upstream unchanged; the upstream's answer reaches the client.
            await ws.send_str('{"type":"response.teleport","x":1}')
            answer = orjson.loads((await ws.receive(timeout=60)).data)
            assert answer["type"] == "error" and answer["error"]["param"] == "type"
        assert emu.ws_other_messages == [{"type": "response.teleport", "x": 1}]


async def test_a_refused_upgrade_reaches_the_client_as_the_refusal(proxy_factory) -> None:
    async with Emulator(ws_refuse=426) as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url)
        with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
            await http.ws_connect(proxy.url + "/v1/responses", headers=BETA)
        assert caught.value.status == 426


async def test_a_bridged_call_inside_a_websocket_turn(proxy_factory) -> None:
    async with Emulator(validate_requests=spec_available()) as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url, extra_args=["--bridge", "context,notes"])
        emu.script(FunctionCall("get_context_remaining", {}, call_id="call_ctx1"), Text("all good", deltas=4),
                   Text("next turn"))
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            evs = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("context left?")}))
            types = [e["type"] for e in evs]
            assert types.count("response.created") == 1 and types[-1] == "response.completed", types
            final = evs[-1]["response"]
            assert [o["type"] for o in final["output"]] == ["mcp_call", "message"]
            seqs = [e["sequence_number"] for e in evs]
            assert seqs == sorted(set(seqs))
            # The merged id chains the next create on the same connection (mapped to the last round's).
            nxt = events(await turn(ws, {"model": "gpt-5", "store": False, "previous_response_id": final["id"],
                                         "input": user("thanks")}))
            assert nxt[-1]["type"] == "response.completed", nxt[-1]
        creates = [r for r in emu.requests if r.transport == "ws"]
        assert len(creates) == 3 and {r.ws_connection for r in creates} == {1}, [r.path for r in emu.requests]
        assert [r.status for r in creates] == [200, 200, 200]
        assert any(t.get("name") == "get_context_remaining" for t in creates[0].json["tools"])
        assert json.dumps(final)


async def test_the_client_leaving_mid_turn_cancels_the_bridged_tool(proxy_factory, tmp_path) -> None:
    from tests.support.procs import processes_mentioning

    work = tmp_path / "ws"
    work.mkdir()
    marker = "ctp-ws-hangup-4242"
    async with Emulator() as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url, extra_args=["--bridge", "shell", "--enable", "shell",
                                                                  "--workspace", str(work)])
        emu.script(FunctionCall("exec_command", {"cmd": f"sleep 60; echo {marker}", "yield_time_ms": 30000}),
                   Text("never sent"))
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            await ws.send_str(orjson.dumps({"type": "response.create", "model": "gpt-5", "input": "run it"}).decode())
            while True:
                msg = await ws.receive(timeout=60)
                assert msg.type == aiohttp.WSMsgType.TEXT, msg
                if orjson.loads(msg.data)["type"] == "response.mcp_call.in_progress":
                    break
            await wait_for(lambda: bool(processes_mentioning(marker)), "the bridged command started")
        # the client left: the command is stopped, and no further round goes upstream
        await wait_for(lambda: not processes_mentioning(marker), "the command stopped")
        await asyncio.sleep(0.5)
        assert len([r for r in emu.requests if r.transport == "ws"]) == 1
        await wait_for(lambda: bool(emu.ws_closed), "the upstream socket closed")


async def test_the_upstream_leaving_mid_turn_reaches_the_client(proxy_factory) -> None:
    async with Emulator() as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url)
        emu.script(Text("cut short", deltas=4, disconnect_after=3))
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            evs = events(await turn(ws, {"model": "gpt-5", "input": user("hi")}))
            assert evs[0]["type"] == "response.created"
            assert evs[-1]["type"] == "error", evs[-1]
            closing = await ws.receive(timeout=60)
            assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1011, closing


async def test_close_codes_and_the_connection_limit_reach_the_client(proxy_factory) -> None:
    async with Emulator(ws_connection_limit=1.0) as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url)
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            ok = events(await turn(ws, {"model": "gpt-5", "input": user("hi")}))
            assert ok[-1]["type"] == "response.completed"
            limit = orjson.loads((await ws.receive(timeout=60)).data)
            assert limit["error"]["code"] == "websocket_connection_limit_reached"
            closing = await ws.receive(timeout=60)
            assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1000
            assert closing.extra == "websocket_connection_limit_reached"
        # The client's own close code reaches the upstream.
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            await ws.close(code=4001, message=b"bye")
        await wait_for(lambda: len(emu.ws_closed) == 2, "the second socket closed")
        assert emu.ws_closed[-1][1] == 4001, emu.ws_closed


async def test_http_proxy_mode_runs_the_creates_through_the_chain(proxy_factory) -> None:
    """Regular (HTTP proxy) mode: the client's socket to a non-official host goes through ctproxy as a proxy;
    its creates run through the chain, and the guard strips the credentials as it does for HTTP."""
    async with Emulator() as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(mode="regular", with_tools=False)
        emu.script(Text("via the proxy"), Text("again"))
        async with http.ws_connect(emu.url + "/v1/responses", headers=BETA, proxy=proxy.url) as ws:
            first = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("hi")}))
            assert first[-1]["type"] == "response.completed", first[-1]
            second = events(await turn(ws, {"model": "gpt-5", "store": False, "input": [],
                                            "previous_response_id": first[-1]["response"]["id"]}))
            assert second[-1]["type"] == "response.completed", second[-1]
        creates = [r for r in emu.requests if r.transport == "ws" and r.route == "responses"]
        assert len(creates) == 2 and {r.ws_connection for r in creates} == {1}
        assert "authorization" not in {k.lower() for k, _ in emu.ws_upgrades[0]}, "not an official host"
        await wait_for(lambda: proxy.log_path.read_bytes().count(b"ctproxy-request POST") >= 2, "log")
        assert all("transport=ws" in ln for ln in proxy.log().splitlines() if "ctproxy-request POST" in ln)


async def test_a_new_context_rollover_across_websocket_turns(proxy_factory) -> None:
    """A stateless client over one socket (it resends its whole history, as Codex does), `--bridge
    context,notes`: the model saves a note and calls `new_context`; the turn's next round and the client's
    next create on the same connection go up in the new window (the notes bootstrap, byte for byte)."""
    from tests.proxy.windows.test_context_bridged_rollover import NOTE
    from tests.proxy.windows.test_context_rollover import assert_bootstrap, start

    async with Emulator(validate_requests=spec_available()) as emu, aiohttp.ClientSession() as http:
        agent = await start(emu, proxy_factory, ["--bridge", "context,notes"])
        emu.script(FunctionCall("notes_write_file", {"path": "checkpoint.md", "text": NOTE}, call_id="c_w"),
                   FunctionCall("new_context", {}, call_id="c_nc"), Text("resumed from the checkpoint"),
                   Text("second answer"))
        headers = {**BETA, "x-ctp-task": agent.task, "x-ctp-agent": "/root"}
        history: list[dict[str, Any]] = [*user("do the work")]
        async with http.ws_connect(agent.proxy.url + "/v1/responses", headers=headers) as ws:
            first = events(await turn(ws, {"model": "gpt-4.1", "store": False, "input": history}))
            assert first[-1]["type"] == "response.completed", first[-1]
            out = first[-1]["response"]["output"]
            assert [(o["type"], o.get("name")) for o in out] == [
                ("mcp_call", "notes_write_file"), ("mcp_call", "new_context"), ("message", None)]
            history += [*out, *user("and now?")]
            second = events(await turn(ws, {"model": "gpt-4.1", "store": False, "input": history}))
            assert second[-1]["type"] == "response.completed", second[-1]
        reqs = [r for r in emu.requests if r.route == "responses"]
        assert len(reqs) == 4 and all(r.transport == "ws" and r.status == 200 for r in reqs)
        assert {r.ws_connection for r in reqs} == {1}
        third = reqs[2].input_items  # the round right after the bridged new_context: the new window only
        assert_bootstrap(third, "/root/notes/checkpoint.md")
        assert "do the work" not in orjson.dumps(third).decode()
        nxt = reqs[3].input_items  # the client's next create: the same window, byte for byte
        assert orjson.dumps(nxt[:4]) == orjson.dumps(third)
        assert "do the work" not in orjson.dumps(nxt).decode() and "and now?" in orjson.dumps(nxt[-1]).decode()


async def test_creates_waiting_on_one_connection_are_bounded(proxy_factory) -> None:
    """Creates run one at a time per connection; at most 16 wait behind the running one (each may be hundreds
    of MiB): a burst of 20 gets an error event for each one beyond, the others all complete, in order."""
    async with Emulator() as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url, extra_args=["--disable", "all"])
        emu.set_default(Text("slow answer", latency=0.05))
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            for i in range(20):
                await ws.send_str(orjson.dumps({"type": "response.create", "model": "gpt-5",
                                                "input": f"burst {i}"}).decode())
            done, refused = [], []
            while len(done) + len(refused) < 20:
                ev = orjson.loads((await ws.receive(timeout=60)).data)
                if ev["type"] == "response.completed":
                    done.append(ev["response"]["id"])
                elif ev["type"] == "error":
                    assert ev["error"]["code"] == "too_many_pending_creates", ev
                    refused.append(ev)
        assert refused and len(done) >= 16
        said = [r.json["input"] for r in emu.requests if r.transport == "ws" and r.route == "responses"]
        assert said == [f"burst {i}" for i in range(len(done))], "the creates ran in the order they came"


async def test_the_checkpoint_turn_goes_over_http_and_leaves_the_sockets_chain_to_the_client(proxy_factory,
                                                                                             tmp_path) -> None:
    """At the hard trigger the context stage runs its checkpoint turn (a held, non-streamed request of ctproxy's
    own) before forwarding the client's create. Over a WebSocket that turn goes over HTTP (the key taken off),
    never over the connection's socket: it gets the JSON answer it asks for (the note is written), and the
    socket's latest response stays the client's, so the client's next create chaining by
    `previous_response_id` with `store: false` finds its own response."""
    from tests.proxy.windows.test_context_checkpoint import is_turn
    from tests.proxy.windows.test_context_reminder import BIG
    from tests.proxy.windows.test_context_rollover import TOOLS, start

    cfg = tmp_path / "ctx.json"
    cfg.write_text(json.dumps({"model_windows": {"gpt-4.1": 4_000},
                               "context": {"reminder_ratio": 0.4, "hard_ratio": 0.5}}))
    async with Emulator() as emu, aiohttp.ClientSession() as http:
        agent = await start(emu, proxy_factory, ["--config", str(cfg)])
        # The session's first request fills the window (no usage yet, so no trigger); the next one's estimate (that
        # usage plus its new items, ADR 0011 decision 11) is over the hard ratio, so its checkpoint turn runs first.
        emu.script(Text("a"),
                   FunctionCall("notes_write_file", {"path": "checkpoint.md", "text": "half done"}, call_id="c_ck"),
                   Text("resumed"), Text("chained"))
        headers = {**BETA, "x-ctp-task": agent.task, "x-ctp-agent": "/root"}
        history: list[dict[str, Any]] = []
        async with http.ws_connect(agent.proxy.url + "/v1/responses", headers=headers) as ws:
            history += user(BIG)
            got = events(await turn(ws, {"model": "gpt-4.1", "store": False, "input": history, "tools": TOOLS}))
            assert got[-1]["type"] == "response.completed", got[-1]
            history += got[-1]["response"]["output"]
            history += user("go on")
            third = events(await turn(ws, {"model": "gpt-4.1", "store": False, "input": history, "tools": TOOLS}))
            assert third[-1]["type"] == "response.completed", third[-1]
            assert third[-1]["response"]["output"][0]["content"][0]["text"] == "resumed", third[-1]
            rid = third[-1]["response"]["id"]
            fourth = events(await turn(ws, {"model": "gpt-4.1", "store": False, "previous_response_id": rid,
                                            "input": user("next"), "tools": TOOLS}))
            assert fourth[-1]["type"] == "response.completed", fourth[-1]
            assert fourth[-1]["response"]["output"][0]["content"][0]["text"] == "chained"
        reqs = [r for r in emu.requests if r.route == "responses"]
        turns = [r for r in reqs if is_turn(r)]
        assert len(turns) == 1 and turns[0].transport == "http" and turns[0].status == 200, \
            [(r.transport, r.status) for r in reqs]
        assert "x-ctproxy-ws" not in {k.lower() for k, _ in turns[0].headers}, "the key never leaves ctproxy"
        assert [r.transport for r in reqs if not is_turn(r)] == ["ws"] * 3
        assert all(r.status == 200 for r in reqs)
        notes = list((agent.proxy.state_dir / "notes").rglob("checkpoint.md"))
        assert len(notes) == 1 and notes[0].read_text() == "half done", "the checkpoint turn's write ran"


async def test_lanes_run_in_parallel_each_fifo(proxy_factory) -> None:
    """`stream_id` lanes on one connection: lane a's create is held in the upstream; lane b's create — a bridged
    turn of two rounds — runs through the chain meanwhile and completes before lane a's; lane a's second create
    waits behind its first (FIFO). Each lane's events come in order and name their lane (the bridge's merged
    lifecycle too)."""
    release = asyncio.Event()

    async def hold_lane_a(rec) -> None:
        if rec.json.get("stream_id") == "a" and "slow" in orjson.dumps(rec.json.get("input")).decode():
            await release.wait()

    async with Emulator(validate_requests=spec_available()) as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url, extra_args=["--bridge", "context"])
        emu.before_answer = hold_lane_a
        emu.script(Text("slow answer on a"), FunctionCall("get_context_remaining", {}, call_id="call_b1"),
                   Text("b is done", deltas=4), Text("second answer on a"))

        def create(lane: str, said: str) -> str:
            return orjson.dumps({"type": "response.create", "stream_id": lane, "model": "gpt-5", "store": False,
                                 "input": user(said)}).decode()

        by_lane: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            await ws.send_str(create("a", "slow one"))
            await wait_for(lambda: len(emu.responses_requests) == 1, "lane a's create reached the upstream")
            await ws.send_str(create("a", "after the slow one"))
            await ws.send_str(create("b", "quick one"))
            while not (by_lane["b"] and by_lane["b"][-1]["type"] in TERMINAL):
                ev = orjson.loads((await ws.receive(timeout=60)).data)
                by_lane[ev.get("stream_id", "?")].append(ev)
            assert by_lane["b"][-1]["type"] == "response.completed", by_lane["b"][-1]
            assert not by_lane["a"], "lane a is still held upstream"
            assert len(emu.responses_requests) == 3, "lane a's second create waits behind its first"
            release.set()
            done_a = 0
            while done_a < 2:
                ev = orjson.loads((await ws.receive(timeout=60)).data)
                assert ev.get("stream_id") == "a", ev
                by_lane["a"].append(ev)
                done_a += ev["type"] == "response.completed"
        b = by_lane["b"]
        assert [o["type"] for o in b[-1]["response"]["output"]] == ["mcp_call", "message"]
        assert [e["type"] for e in b].count("response.created") == 1
        seqs = [e["sequence_number"] for e in b]
        assert seqs == sorted(set(seqs)), "lane b's events in order"
        a_texts = [e["response"]["output"][0]["content"][0]["text"] for e in by_lane["a"]
                   if e["type"] == "response.completed"]
        assert a_texts == ["slow answer on a", "second answer on a"], "lane a is FIFO"
        reqs = emu.responses_requests
        assert [r.json.get("stream_id") for r in reqs] == ["a", "b", "b", "a"]
        assert {r.ws_connection for r in reqs} == {1} and all(r.status == 200 for r in reqs)
        assert "after the slow one" in orjson.dumps(reqs[3].json["input"]).decode()
