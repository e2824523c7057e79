"""The Responses WebSocket through ctproxy (issue 28), the points test_ws_chain.py leaves out: web search on a
create, `/metrics` and the dashboard's request feed counting WebSocket creates, a warm-up (`generate: false`) and
a create chained from it, `response.steer` and a binary frame passed upstream unchanged, compression towards the
upstream negotiated as the client asked, the context stage's guidance and `[id: …]` markers. A plain aiohttp
`ws_connect` client, `ctproxy up` as a real process, the emulator upstream speaking WebSocket mode."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from tests.emulator import Emulator, Text
from tests.openapi_schema import spec_available
from tests.proxy.app.test_metrics import _until, _value
from tests.proxy.ws.test_ws_chain import BETA, events, turn, user

pytestmark = pytest.mark.timeout(180)


async def test_web_search_runs_on_a_websocket_create_and_the_switch_rides_on_the_upgrade(proxy_factory) -> None:
    async with Emulator(validate_requests=spec_available()) as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url, extra_args=["--enable", "web_search"])
        emu.set_default(Text("ok"))
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            got = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("search the web")}))
            assert got[-1]["type"] == "response.completed", got[-1]
        async with http.ws_connect(proxy.url + "/v1/responses", headers={**BETA, "x-ctp-web-search": "off"}) as ws:
            got = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("no search")}))
            assert got[-1]["type"] == "response.completed", got[-1]
        on, off = [r for r in emu.responses_requests if r.transport == "ws"]
        assert [t.get("type") for t in on.json.get("tools") or []] == ["web_search"], on.json
        assert "web_search_call.action.sources" in (on.json.get("include") or [])
        assert not off.json.get("tools") and "include" not in off.json, "off: the create as the client sent it"
        for up in emu.ws_upgrades:
            assert not [k for k, _ in up if k.lower().startswith("x-ctp-")], "ctproxy's own headers never go up"


async def test_metrics_and_the_dashboard_count_websocket_creates(proxy_factory) -> None:
    async with Emulator() as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url)
        token = (proxy.state_dir / "token").read_text().strip()
        emu.script(Text("one"), Text("two"))
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA) as ws:
            for said in ("one", "two"):
                got = events(await turn(ws, {"model": "gpt-5", "input": user(said)}))
                assert got[-1]["type"] == "response.completed", got[-1]
        samples = await _until(http, proxy, token, lambda s: _value(
            s, "ctproxy_requests_total", route="responses", method="POST", status="200") >= 2)
        assert _value(samples, "ctproxy_requests_total", route="responses", method="POST", status="200") == 2
        auth = {"Authorization": f"Bearer {token}"}
        records: list[dict] = []

        async def feed() -> bool:
            async with http.get(proxy.tools_url + "/ui/api/requests", headers=auth) as r:
                assert r.status == 200
                records[:] = (await r.json())["data"]
            return len([x for x in records if x["method"] == "POST"]) >= 2

        async def until_feed() -> None:
            for _ in range(300):
                if await feed():
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(records)

        await until_feed()
        posts = [x for x in records if x["method"] == "POST"]
        assert [(x["path"], x["status"], x["transport"]) for x in posts] == [("/v1/responses", 200, "ws")] * 2
        upgrade = [x for x in records if x["method"] == "GET"]
        assert upgrade and upgrade[0]["transport"] == "ws" and upgrade[0]["path"] == "/v1/responses", upgrade
        assert not [x for x in records if "ctp-ws" in x["path"]], "a connection's key never shows"


async def test_a_warm_up_a_steer_and_compression_pass_as_the_client_sent_them(proxy_factory) -> None:
    async with Emulator(validate_requests=spec_available()) as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url)
        emu.script(Text("after the warm-up"))
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA, compress=0) as ws:
            warm = events(await turn(ws, {"model": "gpt-5", "store": False, "generate": False,
                                          "input": user("warm the cache")}))
            assert warm[0]["type"] == "response.created" and warm[-1]["type"] == "response.completed", warm
            assert not [e for e in warm if e["type"].startswith("response.output")], warm
            assert warm[-1]["response"]["output"] == []
            real = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("now answer"),
                                          "previous_response_id": warm[-1]["response"]["id"]}))
            assert real[-1]["type"] == "response.completed", real[-1]
            assert real[-1]["response"]["output"][0]["content"][0]["text"] == "after the warm-up"
            steer = '{"type":"response.steer","previous_response_id":"resp_x","input":[{"role":"user","content":"go"}]}'
            await ws.send_str(steer)
            answer = orjson.loads((await ws.receive(timeout=60)).data)
            assert answer["type"] == "error" and answer["error"]["param"] == "type", answer  # the emulator's own
            await ws.send_bytes(b"\x00\x01binary\xff")
            answer = orjson.loads((await ws.receive(timeout=60)).data)
            assert answer["type"] == "error" and answer["error"]["code"] == "invalid_frame", answer
        assert emu.ws_other_messages == [orjson.loads(steer)], "the steer reached the upstream as it was sent"
        assert emu.ws_binary == [b"\x00\x01binary\xff"], "a binary frame reached the upstream as it was sent"
        creates = [r for r in emu.responses_requests if r.transport == "ws"]
        assert [r.json.get("generate") for r in creates] == [False, None] and all(r.status == 200 for r in creates)
        async with http.ws_connect(proxy.url + "/v1/responses", headers=BETA, compress=15) as ws:
            assert ws.compress == 15
        offered = ["permessage-deflate" in dict((k.lower(), v) for k, v in up).get("sec-websocket-extensions", "")
                   for up in emu.ws_upgrades]
        assert offered == [False, True], "permessage-deflate towards the upstream only when the client offered it"


async def test_guidance_and_id_markers_on_websocket_creates_keep_the_prefix_byte_identical(proxy_factory) -> None:
    """The context stage on WebSocket creates as on HTTP (tests/proxy/windows/test_context_guidance.py): one guidance
    message
    after the agent's own instructions, `[id: …]` markers beside the agent's items, and the next create of the
    same window forwarded with a byte-identical prefix (the upstream's prompt cache)."""
    import re

    from proxy.windows.notes.bootstrap import GUIDANCE_MARKER
    from tests.proxy.windows.test_context_rollover import TOOLS, start, text_of

    async with Emulator() as emu, aiohttp.ClientSession() as http:  # (TOOLS: the agent's own, loosely typed)
        agent = await start(emu, proxy_factory)
        emu.script(Text("a"), Text("b"))
        headers = {**BETA, "x-ctp-task": agent.task, "x-ctp-agent": "/root"}
        history: list[dict] = [{"role": "developer", "content": "You are a careful agent."}, *user("do the work")]
        async with http.ws_connect(agent.proxy.url + "/v1/responses", headers=headers) as ws:
            got = events(await turn(ws, {"model": "gpt-4.1", "store": False, "input": history, "tools": TOOLS}))
            assert got[-1]["type"] == "response.completed", got[-1]
            history += [*got[-1]["response"]["output"], *user("and more")]
            got = events(await turn(ws, {"model": "gpt-4.1", "store": False, "input": history, "tools": TOOLS}))
            assert got[-1]["type"] == "response.completed", got[-1]
        first, second = (r.input_items for r in emu.responses_requests)
        assert all(r.transport == "ws" and r.status == 200 for r in emu.responses_requests)
        for items in (first, second):
            guidance = [k for k, i in enumerate(items)
                        if i.get("role") == "developer" and text_of(i).startswith(GUIDANCE_MARKER)]
            assert guidance == [1], items
            assert text_of(items[0]).endswith("You are a careful agent.")
        user_item = next(i for i in second if i.get("role") == "user")
        assert re.match(r"^\[id: it_[0-9a-f]+\]$", user_item["content"][0]["text"]), user_item
        assert orjson.dumps(second[:len(first)]) == orjson.dumps(first), "the prefix stays byte-identical"


async def test_the_chatgpt_sign_in_route_over_the_websocket(proxy_factory) -> None:
    """`/backend-api/codex/responses` (ChatGPT sign-in) over the WebSocket, as Codex signed in opens it: each
    create runs through the chain (journaled as one session, one request-log line with transport=ws)
    and goes up over ctproxy's socket; the sign-in credentials follow the one credential rule — the emulator is
    a trusted gateway, which gets API keys only, so the JWT and the account id reach it on no frame and no
    upgrade."""
    from tests.proxy.windows.test_compaction_harness import ACCOUNT, JWT_SECRET_PART, codex_token

    async with Emulator() as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url)
        emu.script(Text("signed in"), Text("still signed in"))
        headers = {"OpenAI-Beta": "responses_websockets=2026-02-06", "Authorization": f"Bearer {codex_token()}",
                   "chatgpt-account-id": ACCOUNT, "session_id": "sess-ws-codex-route", "originator": "codex_cli_rs"}
        async with http.ws_connect(proxy.url + "/backend-api/codex/responses", headers=headers) as ws:
            first = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("over the codex route")}))
            assert first[-1]["type"] == "response.completed", first[-1]
            second = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("again"),
                                            "previous_response_id": first[-1]["response"]["id"]}))
            assert second[-1]["type"] == "response.completed", second[-1]
        creates = [r for r in emu.requests if r.route == "responses"]
        assert [(r.transport, r.path) for r in creates] == [("ws", "/backend-api/codex/responses")] * 2
        assert {r.ws_connection for r in creates} == {1}
        seen = [v for up in emu.ws_upgrades for _, v in up] + [v for r in emu.requests for _, v in r.headers]
        assert not [v for v in seen if JWT_SECRET_PART in v or ACCOUNT in v], "sign-in credentials reach no gateway"
        for _ in range(300):
            if proxy.log().count("ctproxy-request POST /backend-api/codex/responses") >= 2:
                break
            await asyncio.sleep(0.1)
        lines = [ln for ln in proxy.log().splitlines() if "ctproxy-request POST /backend-api/codex/responses" in ln]
        assert len(lines) == 2 and all("transport=ws" in ln for ln in lines), proxy.log()[-2000:]
        assert JWT_SECRET_PART not in proxy.log()
        from tests.proxy.ws.test_ws_chain import _tasks

        tasks = orjson.loads(await asyncio.to_thread(_tasks, proxy))
        sessions = [s for t in tasks for a in t["agents"] for s in a["sessions"]]
        assert len(sessions) == 1 and sessions[0]["items"] == 4 and sessions[0]["responses"] == 2, tasks
