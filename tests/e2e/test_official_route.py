"""ctproxy on its DEFAULT upstream, end to end against the official-route double (tests/support/official.py):
`api.openai.com` and `chatgpt.com` are the emulator on 127.0.0.1:443 inside a private network namespace, with a
certificate from a throw-away CA that ctproxy trusts through `--upstream-ca` (issue 43). Skips without root."""

from __future__ import annotations

import base64
import json

import aiohttp
import pytest

from tests.emulator import Text
from tests.support.official import official  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(240)

API_KEY = "sk-official-double-not-real-0123"


def jwt_token() -> str:
    """A test token shaped like a ChatGPT sign-in's JWT (header.payload.signature): never a real one."""
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part({'sub': 'test-user', 'exp': 4102444800})}.c2lnbmF0dXJl"


async def post(url: str, path: str, headers: dict[str, str], body: dict | None = None) -> tuple[int, dict]:
    body = body or {"model": "gpt-5", "input": "hello official", "store": False}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http, \
            http.post(url + path, json=body, headers=headers) as resp:
        raw = await resp.read()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, {"raw": raw.decode(errors="replace")}


def host_of(rec) -> str:
    return (rec.header("host") or "").split(":")[0]


async def test_each_credential_kind_reaches_its_own_official_host(official):  # noqa: F811
    emu = official.emulator
    emu.script(Text("api route answer"), Text("codex route answer"))
    proxy = await official.proxy()
    status, body = await post(proxy.url, "/v1/responses", {"Authorization": f"Bearer {API_KEY}"})
    assert status == 200, (body, proxy.log()[-2000:])
    assert body["output"][-1]["content"][0]["text"] == "api route answer"
    token = jwt_token()
    status, body = await post(proxy.url, "/backend-api/codex/responses",
                              {"Authorization": f"Bearer {token}", "chatgpt-account-id": "acct-test"})
    assert status == 200, (body, proxy.log()[-2000:])
    api, codex = emu.requests
    assert (host_of(api), api.path) == ("api.openai.com", "/v1/responses")
    assert api.header("authorization") == f"Bearer {API_KEY}"
    assert (host_of(codex), codex.path) == ("chatgpt.com", "/backend-api/codex/responses")
    assert codex.header("authorization") == f"Bearer {token}" and codex.header("chatgpt-account-id") == "acct-test"


@pytest.mark.parametrize(("path", "headers"), [
    ("/v1/responses", {"Authorization": f"Bearer {jwt_token()}"}),  # a sign-in toward the API host
    ("/backend-api/codex/responses", {"Authorization": f"Bearer {API_KEY}"}),  # a key toward chatgpt.com
])
async def test_the_wrong_kind_for_a_host_is_refused_and_nothing_leaves(official, path, headers):  # noqa: F811
    proxy = await official.proxy()
    status, body = await post(proxy.url, path, headers)
    assert status == 403, body
    assert body["error"]["code"] == "credential_kind_mismatch", body
    assert official.emulator.requests == []


async def test_without_upstream_ca_the_certificate_is_refused_with_a_clean_502(official):  # noqa: F811
    proxy = await official.proxy(upstream_ca=False)
    status, body = await post(proxy.url, "/v1/responses", {"Authorization": f"Bearer {API_KEY}"})
    assert status == 502, body
    text = json.dumps(body).lower()
    assert "certificate" in text and "upstream-ca" in text, body
    assert official.emulator.requests == []
    assert API_KEY not in proxy.log()


async def test_each_official_host_serves_its_own_route_only(official):  # noqa: F811
    """The emulator's official-host rule (tests/emulator/official.py), seen through the double directly."""
    from tests.support.official import client_ssl, loopback_connector

    emu = official.emulator
    async with aiohttp.ClientSession(connector=loopback_connector()) as http:
        for host, path in (("api.openai.com", "/backend-api/codex/responses"), ("chatgpt.com", "/v1/responses")):
            async with http.post(f"https://127.0.0.1:443{path}", json={"model": "gpt-5", "input": "x"},
                                 headers={"Host": host}, ssl=client_ssl(official.ca_pem),
                                 server_hostname=host) as resp:
                assert resp.status == 404, (host, path, await resp.text())
    assert [r.route for r in emu.requests] == ["other", "other"]
