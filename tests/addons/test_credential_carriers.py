"""Keys outside the headers under the one credential rule (seed 004 pipeline defect 2; seed §6, §11): the query
string's key parameters (`api-key`, `api_key`, `key`, `access_token`), over HTTP and on a WebSocket upgrade,
and the subprotocols that carry a key (`openai-insecure-api-key.…`). An untrusted upstream gets none of them;
a trusted or official one is judged as for headers; the request log never prints them."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from proxy import routes
from tests.emulator import Emulator, Text
from tests.proxy.ws.test_ws_chain import turn, user

pytestmark = pytest.mark.timeout(180)

QS, WSQ, PROTO, HDR = "sk-QSLEAK-0123456789", "sk-WSQLEAK-0123456789", "sk-PROTOLEAK-0123", "sk-HDR-0123456789"
BETA = {"OpenAI-Beta": "responses_websockets=2026-02-06", "Authorization": f"Bearer {HDR}"}
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"


def test_the_rule_reads_the_query_and_the_subprotocols():
    untrusted = routes.Route("api", official=False, trusted=False)
    trusted = routes.Route("api", official=False, trusted=True)
    path = "/v1/responses?api-version=1&api-key=sk-a&Key=sk-b&access_token=sk-c&api_key=sk-d"
    assert routes.query_credentials(path) == [("api-key", "sk-a"), ("api-key", "sk-b"),
                                              ("authorization", "Bearer sk-c"), ("api-key", "sk-d")]
    assert routes.without_query_credentials(path) == "/v1/responses?api-version=1"
    assert routes.without_query_credentials("/v1/responses?key=x") == "/v1/responses"
    protocols = "realtime, openai-insecure-api-key.sk-p, openai-organization.org-1, openai-beta.realtime-v1"
    assert routes.without_credential_protocols(protocols) == "realtime, openai-beta.realtime-v1"
    assert routes.carried_credentials("/v1/responses", [("Sec-WebSocket-Protocol", protocols)]) == [
        ("authorization", "Bearer sk-p"), ("openai-organization", "org-1")]
    # judged as headers are: a key anywhere goes to an untrusted upstream never, to a trusted one as a key
    for where in (("/v1/responses?api-key=sk-a", []),
                  ("/v1/responses", [("Sec-WebSocket-Protocol", "openai-insecure-api-key.sk-p")])):
        assert not routes.may_receive_credentials("http", "gw", 80, where[0], untrusted, True, where[1])
        assert routes.may_receive_credentials("http", "gw", 80, where[0], trusted, True, where[1])
    # a sign-in in the query is still a sign-in: never to a gateway, and the wrong kind for api.openai.com
    assert not routes.may_receive_credentials("http", "gw", 80, f"/v1/responses?access_token={JWT}", trusted,
                                              True, [])
    assert routes.credential_mismatch("https", "api.openai.com", 443, f"/v1/responses?access_token={JWT}",
                                      []) is not None


async def test_an_untrusted_upstream_gets_no_key_from_the_query_or_a_subprotocol(proxy_factory):
    async with Emulator() as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url, trust_upstream=False)
        emu.script(Text("over http"), Text("over ws"))
        async with http.post(f"{proxy.url}/v1/responses?api-version=2&api-key={QS}",
                             json={"model": "gpt-5", "input": "hi"},
                             headers={"Authorization": f"Bearer {HDR}"}) as resp:
            assert resp.status == 200, await resp.text()
        async with http.ws_connect(f"{proxy.url}/v1/responses?api-key={WSQ}", headers=BETA,
                                   protocols=("realtime", f"openai-insecure-api-key.{PROTO}")) as ws:
            frames = await turn(ws, {"model": "gpt-5", "store": False, "input": user("hello")})
            assert orjson.loads(frames[-1])["type"] == "response.completed", frames[-1]
        posted = next(r for r in emu.requests if r.transport == "http")
        assert posted.query == "api-version=2" and posted.header("authorization") in ("", None)
        created = next(r for r in emu.requests if r.transport == "ws")
        assert WSQ not in created.query and PROTO not in str(created.headers)
        upgrade = emu.ws_upgrades[-1]
        assert not [v for k, v in upgrade if PROTO in v or WSQ in v or HDR in v], upgrade
        assert ("realtime" in dict((k.lower(), v) for k, v in upgrade).get("sec-websocket-protocol", ""))
        await proxy.astop()
        log = proxy.log()
        for secret in (QS, WSQ, PROTO, HDR):
            assert secret not in log, secret


async def test_a_trusted_upstream_gets_the_query_key_as_it_gets_a_header(proxy_factory):
    async with Emulator() as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(upstream=emu.url)
        emu.script(Text("over http"))
        async with http.post(f"{proxy.url}/v1/responses?api-key={QS}", json={"model": "gpt-5", "input": "hi"}) as r:
            assert r.status == 200, await r.text()
        assert emu.requests[-1].query == f"api-key={QS}"
        await proxy.astop()
        assert QS not in proxy.log()
