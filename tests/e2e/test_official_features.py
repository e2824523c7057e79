"""The official-only behaviour on the official-route double (tests/support/official.py, issue 43 point 4):
ctproxy on its default upstream, `api.openai.com` / `chatgpt.com` being the TLS emulator inside a private network.
Skips without root."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.e2e.test_official_route import API_KEY, host_of, jwt_token, post
from tests.emulator import Text
from tests.proxy.ws.test_ws_chain import events, turn, user
from tests.support.official import loopback_connector, official  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(240)


def hosted_search(rec) -> int:
    return sum(1 for t in rec.json.get("tools") or [] if t.get("type") == "web_search")


async def test_native_web_search_is_injected_on_both_official_routes_and_the_opt_out_honoured(official):  # noqa: F811
    official.emulator.set_default(Text("ok"))
    proxy = await official.proxy()
    api = {"Authorization": f"Bearer {API_KEY}"}
    codex = {"Authorization": f"Bearer {jwt_token()}", "chatgpt-account-id": "acct-test"}
    for path, headers in (("/v1/responses", api), ("/backend-api/codex/responses", codex)):
        assert (await post(proxy.url, path, headers))[0] == 200
        assert (await post(proxy.url, path, {**headers, "x-ctp-web-search": "off"}))[0] == 200
    reqs = official.emulator.requests
    assert [(host_of(r), hosted_search(r)) for r in reqs] == [
        ("api.openai.com", 1), ("api.openai.com", 0), ("chatgpt.com", 1), ("chatgpt.com", 0)]
    assert not [k for r in reqs for k, _ in r.headers if k.lower().startswith("x-ctp-")]


async def test_the_responses_websocket_goes_up_over_wss_with_the_clients_key(official):  # noqa: F811
    """ctproxy's own upstream socket (proxy/upstream/ws.py) is wss://api.openai.com: it trusts the test CA only
    through --upstream-ca, and carries the client's key to the official host."""
    emu = official.emulator
    emu.script(Text("first over wss"), Text("second over wss"))
    proxy = await official.proxy()
    headers = {"OpenAI-Beta": "responses_websockets=2026-02-06", "Authorization": f"Bearer {API_KEY}"}
    async with aiohttp.ClientSession(connector=loopback_connector()) as http, \
            http.ws_connect(proxy.url + "/v1/responses", headers=headers) as ws:
        first = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("hello over wss")}))
        assert first[-1]["type"] == "response.completed", (first[-1], proxy.log()[-2000:])
        second = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("again"),
                                        "previous_response_id": first[-1]["response"]["id"]}))
        assert second[-1]["response"]["output"][0]["content"][0]["text"] == "second over wss"
    creates = [r for r in emu.requests if r.route == "responses"]
    assert [(r.transport, r.status) for r in creates] == [("ws", 200), ("ws", 200)], "no fallback to HTTP"
    assert emu.ws_connections == 1
    upgrade = dict((k.lower(), v) for k, v in emu.ws_upgrades[0])
    assert upgrade["host"].split(":")[0] == "api.openai.com" and upgrade["authorization"] == f"Bearer {API_KEY}"
    assert API_KEY not in proxy.log()


COMPACTING = {"remote_compaction": {"enabled": True}, "model_windows": {"gpt-test*": 20_000, "*": 128_000}}


async def test_remote_compaction_v2_on_both_official_routes_with_the_sessions_credential(
        official, tmp_path):  # noqa: F811
    """The API route compacts through `api.openai.com/v1/responses/compact` with the key; the Codex route
    through the compaction trigger on `chatgpt.com/backend-api/codex/responses` with the sign-in (official only:
    a gateway never gets a sign-in). Later turns replay the exact item; a model switch gets the readable
    fallback instead."""
    from proxy.windows.fallback import is_fallback_message
    from tests.e2e.test_compaction_e2e import turn_text
    from tests.proxy.windows.test_compaction_harness import (
        ACCOUNT,
        assistant,
        codex_token,
        codex_turn,
        completed_output_text,
    )
    from tests.proxy.windows.test_compaction_harness import user as msg

    cfg = tmp_path / "config.json"
    cfg.write_text(orjson.dumps(COMPACTING).decode())
    emu = official.emulator
    proxy = await official.proxy(extra_args=["--config", str(cfg)])
    history: list = []
    for i in range(1, 14):  # the API route, as the openai SDK would send it (non-streamed)
        history.append(msg(turn_text(i)))
        status, body = await post(proxy.url, "/v1/responses", {"Authorization": f"Bearer {API_KEY}"},
                                  {"model": "gpt-test-1", "input": history, "store": False})
        assert status == 200, body
        history.append(assistant(body["output"][-1]["content"][0]["text"]))
    compacts = [r for r in emu.requests if r.route == "compact"]
    assert [(host_of(r), r.path, r.header("authorization")) for r in compacts] == [
        ("api.openai.com", "/v1/responses/compact", f"Bearer {API_KEY}")]
    later = [r for r in emu.requests if r.route == "responses" and r.received_at > compacts[0].received_at]
    assert later and all(any(i.get("type") == "compaction" for i in r.json["input"]) for r in later)
    history.append(msg("now with another model"))
    status, _ = await post(proxy.url, "/v1/responses", {"Authorization": f"Bearer {API_KEY}"},
                           {"model": "gpt-test-2", "input": history, "store": False})
    assert status == 200
    last = emu.requests[-1].json
    assert last["model"] == "gpt-test-2" and is_fallback_message(last["input"][0])
    assert "encrypted_content" not in orjson.dumps(last["input"]).decode()

    codex_history: list = []
    async with aiohttp.ClientSession(connector=loopback_connector()) as http:
        for i in range(1, 14):
            codex_history.append(msg(turn_text(i)))
            status, evs = await codex_turn(http, proxy.url, {"model": "gpt-test-1", "input": list(codex_history),
                                                             "store": False}, session_id="sess-official")
            assert status == 200, evs
            codex_history.append(assistant(completed_output_text(evs)))
    (comp,) = [r for r in emu.requests if r.route == "compaction"]
    assert (host_of(comp), comp.path) == ("chatgpt.com", "/backend-api/codex/responses")
    assert comp.header("authorization") == f"Bearer {codex_token()}" and comp.header("chatgpt-account-id") == ACCOUNT
    assert "remote_compaction_v2" in (comp.header("x-codex-beta-features") or "")
    assert comp.json["input"][-1] == {"type": "compaction_trigger"}


async def _tool(http, proxy, tool: str, args: dict, task: str) -> dict:
    """A REST tool call for `task`, retried while the session's hand-over has not arrived yet."""
    import asyncio

    from proxy.state import StateDir

    headers = {"Authorization": f"Bearer {StateDir.open(proxy.state_dir).token()}", "x-ctp-task": task}
    async with asyncio.timeout(60):
        while True:
            async with http.post(f"{proxy.tools_url}/v1/tools/{tool}", json=args, headers=headers) as resp:
                body = await resp.json()
            if body.get("ok") or body.get("details", {}).get("error") != "no_credentials":
                return body
            await asyncio.sleep(0.1)


async def test_images_and_the_sidecar_use_the_sessions_credential_on_the_official_hosts(
        official, tmp_path):  # noqa: F811
    """The tool server's own calls (proxy/upstream/trust.py in its process): an image and a sidecar search with
    the API key go to api.openai.com, an image with the sign-in to chatgpt.com's Codex route."""
    from proxy.app.journal_views import new_task
    from proxy.state import StateDir
    from tests.emulator.search import hosted_search

    cfg = tmp_path / "config.json"
    cfg.write_text(orjson.dumps({"web_search": {"backend": "sidecar", "sidecar_model": "gpt-5"}}).decode())
    emu = official.emulator
    emu.set_default(hosted_search())
    proxy = await official.proxy(extra_args=["--enable", "image_generation", "--config", str(cfg)],
                                 env={"OPENAI_API_KEY": ""})
    state = StateDir.open(proxy.state_dir)
    key_task, jwt_task = new_task(state), new_task(state)
    token = jwt_token()
    async with aiohttp.ClientSession(connector=loopback_connector()) as http:
        for path, headers, task in (
                ("/v1/responses", {"Authorization": f"Bearer {API_KEY}"}, key_task),
                ("/backend-api/codex/responses", {"Authorization": f"Bearer {token}",
                                                  "chatgpt-account-id": "acct-img"}, jwt_task)):
            body = {"model": "gpt-5", "input": "hello", "store": False, "stream": path.startswith("/backend")}
            async with http.post(proxy.url + path, json=body, headers={**headers, "x-ctp-task": task}) as resp:
                assert resp.status == 200, await resp.text()
        img_key = await _tool(http, proxy, "openai_generate_image", {"prompt": "a heron"}, key_task)
        img_jwt = await _tool(http, proxy, "openai_generate_image", {"prompt": "a crane"}, jwt_task)
        found = await _tool(http, proxy, "openai_web_search", {"query": "asyncio docs"}, key_task)
    assert img_key["ok"] and img_jwt["ok"] and found["ok"], (img_key, img_jwt, found, proxy.log()[-2000:])
    images = [r for r in emu.requests if r.route == "images"]
    assert [(host_of(r), r.path, r.header("authorization")) for r in images] == [
        ("api.openai.com", "/v1/images/generations", f"Bearer {API_KEY}"),
        ("chatgpt.com", "/backend-api/codex/images/generations", f"Bearer {token}")]
    assert images[1].header("chatgpt-account-id") == "acct-img"
    search = [r for r in emu.requests if r.route == "responses" and r.header("x-ctp-task") is None][-1]
    assert (host_of(search), search.path, search.header("authorization")) == (
        "api.openai.com", "/v1/responses", f"Bearer {API_KEY}")
    assert any(t.get("type") == "web_search" for t in search.json["tools"])


async def test_a_bridged_turn_sends_its_next_round_to_the_official_host_with_the_clients_key(official):  # noqa: F811
    """The bridge runs ctproxy's tool and sends the next round itself (proxy/upstream/transport.py, trusting the
    test CA through --upstream-ca): both rounds reach api.openai.com with the client's key."""
    from tests.emulator import FunctionCall

    emu = official.emulator
    emu.script(FunctionCall("get_context_remaining", {}, call_id="call_ctx1"), Text("all good"))
    proxy = await official.proxy(extra_args=["--bridge", "context"])
    status, body = await post(proxy.url, "/v1/responses", {"Authorization": f"Bearer {API_KEY}"},
                              {"model": "gpt-4.1", "input": "how much context is left?", "store": False})
    assert status == 200, (body, proxy.log()[-2000:])
    assert [o["type"] for o in body["output"]] == ["mcp_call", "message"], body
    rounds = [r for r in emu.requests if r.route == "responses"]
    assert [(host_of(r), r.path, r.header("authorization")) for r in rounds] == [
        ("api.openai.com", "/v1/responses", f"Bearer {API_KEY}")] * 2
    out = next(i for i in rounds[1].json["input"] if i.get("type") == "function_call_output")
    assert out["call_id"] == "call_ctx1"
