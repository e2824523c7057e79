"""The official-only behaviour on the official-route double (tests/support/official.py, issue 43 point 4):
ctproxy on its default upstream, `api.openai.com` / `chatgpt.com` being the TLS emulator inside a private network.
Skips without root."""

from __future__ import annotations

import aiohttp
import pytest

from tests.emulator import Text
from tests.support.official import loopback_connector, official  # noqa: F401  (the fixture)
from tests.test_official_route import API_KEY, host_of, jwt_token, post
from tests.test_ws_chain import events, turn, user

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
