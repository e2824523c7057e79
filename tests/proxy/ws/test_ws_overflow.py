"""Overflow recovery over the Responses WebSocket (issue 28): the upstream's `context_length_exceeded` error
event on ctproxy's socket is compacted and retried by the chain's compaction stage — over the same socket —
before anything reached the client, as on HTTP (tests/proxy/windows/test_overflow.py)."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.emulator import Emulator, context_length_exceeded_400
from tests.proxy.windows.test_compaction_harness import API_KEY, running_proxy, user
from tests.proxy.windows.test_overflow import OLDER, config
from tests.proxy.ws.test_ws_chain import TERMINAL

pytestmark = pytest.mark.timeout(180)


async def test_an_overflow_event_is_compacted_and_retried_before_the_client_sees_anything(tmp_path) -> None:
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, config()) as base, \
            aiohttp.ClientSession() as http:
        emu.script(context_length_exceeded_400())
        async with http.ws_connect(base + "/v1/responses", headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
            create = {"type": "response.create", "model": "gpt-test-1", "input": [user(OLDER), user("the question")]}
            await ws.send_str(orjson.dumps(create).decode())
            events = []
            while not events or events[-1]["type"] not in TERMINAL:
                msg = await ws.receive(timeout=60)
                assert msg.type == aiohttp.WSMsgType.TEXT, msg
                events.append(orjson.loads(msg.data))
        assert [e for e in events if e["type"] == "error"] == [], "the client never saw the overflow"
        assert events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "You said: the question"
        first, retry = [r for r in emu.requests if r.route == "responses"]
        assert (first.transport, first.status) == ("ws", 400) and (retry.transport, retry.status) == ("ws", 200)
        assert first.ws_connection == retry.ws_connection == 1, "the retry went over the same socket"
        assert any(i.get("type") == "compaction" for i in retry.json["input"])
        compact = [r for r in emu.requests if r.route == "compact"]
        assert len(compact) == 1 and compact[0].transport == "http"
        assert "x-ctproxy-ws" not in {k.lower() for k, _ in compact[0].headers}, "the key never leaves ctproxy"


async def test_a_message_above_aiohttps_default_passes_and_one_above_the_limit_closes_with_1009(tmp_path) -> None:
    # (with mitmproxy's WebSocket relay, `raw_relay: false`; the default raw relay: the test below)
    """The message limit is `websocket.max_message_bytes` (default 256 MiB): an 8 MiB create (twice aiohttp's
    default limit) runs through the chain and reaches the upstream; with the limit at 1 MiB, a 2 MiB one closes the
    socket with 1009 (message too big) and nothing reaches the upstream."""
    big = '{"type":"response.create","model":"gpt-5","store":false,"input":"' + "x" * (8 * 1024 * 1024) + '"}'
    async with Emulator(ws_max_message=0) as emu, running_proxy(tmp_path, emu.url, {}) as base, \
            aiohttp.ClientSession() as http:
        async with http.ws_connect(base + "/v1/responses", max_msg_size=0, compress=15) as ws:
            assert ws.compress == 15, "the adapter negotiated compression as the client asked (raw relay)"
            await ws.send_str(big)
            while True:
                msg = await ws.receive(timeout=120)
                assert msg.type == aiohttp.WSMsgType.TEXT, msg
                if orjson.loads(msg.data)["type"] in TERMINAL:
                    break
        assert orjson.loads(msg.data)["type"] == "response.completed"
        assert emu.requests[-1].json["input"] == "x" * (8 * 1024 * 1024)
    small = tmp_path / "small"
    async with Emulator() as emu, running_proxy(small, emu.url, {"websocket": {"max_message_bytes": 1 << 20,
                                                                                      "raw_relay": False}}) \
            as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(base + "/v1/responses") as ws:
            await ws.send_str(big[: 2 << 20])
            msg = await ws.receive(timeout=120)
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1009, msg
        # Compressed (permessage-deflate, as the client asked): a 2 MiB message that deflates to a few KiB is
        # bounded by its decompressed size (a compression bomb never inflates past the limit).
        async with http.ws_connect(base + "/v1/responses", compress=15) as ws:
            assert ws.compress == 15, "compression was negotiated as the client asked"
            ok = '{"type":"response.create","model":"gpt-5","input":"' + "y" * (512 * 1024) + '"}'
            await ws.send_str(ok)
            while True:
                msg = await ws.receive(timeout=120)
                assert msg.type == aiohttp.WSMsgType.TEXT, msg
                if orjson.loads(msg.data)["type"] in TERMINAL:
                    break
            assert orjson.loads(msg.data)["type"] == "response.completed"
            await ws.send_str(big[: 2 << 20])
            msg = await ws.receive(timeout=120)
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1009, msg
        sent = [r for r in emu.requests if r.transport == "ws" and r.route == "responses"]
        assert len(sent) == 1 and sent[0].json["input"] == "y" * (512 * 1024)


async def test_through_the_raw_relay_a_message_above_the_limit_gets_the_client_a_1009_close(tmp_path) -> None:
    """With the default config (`websocket.raw_relay` on), a message above `websocket.max_message_bytes` closes
    the client's socket with 1009 (message too big) — the close reaches the client, which is not left waiting —
    and nothing reaches the upstream; a new connection then works."""
    big = '{"type":"response.create","model":"gpt-5","store":false,"input":"' + "x" * (4 << 20) + '"}'
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, {"websocket": {"max_message_bytes": 1 << 20}}) \
            as base, aiohttp.ClientSession() as http:
        for compress in (0, 15):
            async with http.ws_connect(base + "/v1/responses", compress=compress) as ws:
                await ws.send_str(big)
                msg = await ws.receive(timeout=60)
                assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1009, msg
        async with http.ws_connect(base + "/v1/responses") as ws:
            await ws.send_str('{"type":"response.create","model":"gpt-5","input":"small"}')
            while True:
                msg = await ws.receive(timeout=60)
                assert msg.type == aiohttp.WSMsgType.TEXT, msg
                if orjson.loads(msg.data)["type"] in TERMINAL:
                    break
            assert orjson.loads(msg.data)["type"] == "response.completed"
        assert [r.json["input"] for r in emu.requests if r.route == "responses"] == ["small"]


async def test_status_says_the_running_proxy_handles_the_websocket_with_its_limit_and_relay(tmp_path) -> None:
    """`ctproxy status` (text and --json) reports what the running proxy does with a Responses WebSocket: handled
    by the adapter, its message limit and whether mitmproxy relays the socket raw (run.json, written by `up`)."""
    import asyncio
    import json
    import subprocess
    import sys

    def status(*extra: str) -> str:
        res = subprocess.run([sys.executable, "-m", "proxy.app.cli", "status", "--state-dir", str(tmp_path / "state"),
                              *extra], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return res.stdout

    async with Emulator() as emu, running_proxy(tmp_path, emu.url, {"websocket": {"max_message_bytes": 3 << 20,
                                                                                   "raw_relay": False}}) as base:
        text, js = await asyncio.to_thread(status), json.loads(await asyncio.to_thread(status, "--json"))
    [line] = [ln for ln in text.splitlines() if ln.startswith("websocket:")]
    assert line.startswith(f"websocket: handled ({base}/v1/responses): each response.create runs through the chain")
    assert "max message 3 MiB" in line and "raw relay off" in line, line
    assert js["proxy"]["websocket"] == {"adapter": True, "max_message_bytes": 3 << 20, "raw_relay": False}
    async with Emulator() as emu, running_proxy(tmp_path / "b", emu.url):
        res = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "proxy.app.cli", "status", "--state-dir",
                                                       str(tmp_path / "b" / "state")], capture_output=True, text=True,
                                      timeout=120)
    [line] = [ln for ln in res.stdout.splitlines() if ln.startswith("websocket:")]
    assert "max message 256 MiB" in line and "raw relay on" in line, line


async def test_a_closed_connections_state_is_released(tmp_path) -> None:
    """Memory stays flat however many conversations come and go (the soak's figure: docs/websocket.md, Cost): once
    a client's socket is closed, nothing of its connection stays — no registered upstream socket, no live key,
    no connection, client socket or upstream socket object (counted after a collection), the upgrade's one-time
    job consumed — after 3 connections as after 30."""
    import asyncio
    import gc

    from proxy.upstream import ws as upws
    from proxy.ws import server as wss

    def alive() -> dict[str, int]:
        gc.collect()
        kinds = (wss._Connection, wss._ClientSocket, upws.UpstreamSocket)
        counts = {k.__name__: 0 for k in kinds}
        for obj in gc.get_objects():
            for k in kinds:
                if type(obj) is k:
                    counts[k.__name__] += 1
        services = [o for o in gc.get_objects() if type(o) is wss.WsService]
        counts["live"] = sum(len(s._live) for s in services)
        counts["jobs"] = sum(len(s._jobs) for s in services)
        counts["open"] = sum(s.connections for s in services)
        counts["registered"] = len(upws._SOCKETS)
        return counts

    async def conversations(http: aiohttp.ClientSession, base: str, n: int) -> None:
        async def one(i: int) -> None:
            async with http.ws_connect(base + "/v1/responses", headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
                await ws.send_str(orjson.dumps({"type": "response.create", "model": "gpt-5", "store": False,
                                                "input": f"conversation {i}"}).decode())
                while True:
                    msg = await ws.receive(timeout=60)
                    assert msg.type == aiohttp.WSMsgType.TEXT, msg
                    if orjson.loads(msg.data)["type"] in TERMINAL:
                        break
        await asyncio.gather(*(one(i) for i in range(n)))

    empty = {"_Connection": 0, "_ClientSocket": 0, "UpstreamSocket": 0, "live": 0, "jobs": 0, "open": 0,
             "registered": 0}
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, {}) as base, aiohttp.ClientSession() as http:
        for n in (3, 30):
            await conversations(http, base, n)
            async with asyncio.timeout(60):  # the adapter's side of each close runs after the client's
                while (now := alive()) != empty:
                    await asyncio.sleep(0.1)
            assert now == empty
        assert len([r for r in emu.requests if r.transport == "ws"]) == 33


async def test_a_lanes_state_is_released_while_its_connection_stays_open(tmp_path) -> None:
    """A connection lives up to an hour and may name a new `stream_id` for every request: once a lane's creates
    are answered, nothing of the lane stays — no waiting queue, no worker, no upstream lane — while the socket
    itself stays open and usable."""
    import asyncio
    import gc

    from proxy.ws import server as wss

    async with Emulator() as emu, running_proxy(tmp_path, emu.url, {}) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(base + "/v1/responses", headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
            for batch in range(3):
                for j in range(10):
                    await ws.send_str(orjson.dumps({"type": "response.create", "model": "gpt-5", "store": False,
                                                    "stream_id": f"lane_{batch}_{j}", "input": f"lane {j}"}).decode())
                done = 0
                while done < 10:
                    msg = await ws.receive(timeout=60)
                    assert msg.type == aiohttp.WSMsgType.TEXT, msg
                    event = orjson.loads(msg.data)
                    assert event["type"] != "error", event
                    done += event["type"] == "response.completed"
                conns = [o for o in gc.get_objects() if type(o) is wss._Connection]
                assert len(conns) == 1
                conn = conns[0]
                async with asyncio.timeout(30):  # a lane's worker ends right after its last event is sent
                    while conn.lanes or conn.workers or conn.sock.lanes or conn.pending or conn.running:
                        await asyncio.sleep(0.05)
            assert not ws.closed
        assert len([r for r in emu.requests if r.transport == "ws"]) == 30
