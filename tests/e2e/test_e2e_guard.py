"""The credential boundary end to end: an "evil" upstream records what reached it."""

from __future__ import annotations

import aiohttp
import pytest

SECRETS = {
    "AuthoriZation": "Bearer sk-live-SECRET-abc123",
    "ChatGPT-Account-Id": "acct-SECRET-42",
    "openai-organization": "org-SECRET",
    "OPENAI-PROJECT": "proj-SECRET",
    "Cookie": "session=SECRET-cookie",
    "x-api-key": "SECRET-xkey",
}


def _leaked(emulator) -> list[str]:
    found = []
    for rec in emulator.requests:
        for name, value in rec.headers:
            if "SECRET" in value:
                found.append(name)
    return found


async def test_untrusted_upstream_never_gets_credentials(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, trust_upstream=False)
    async with aiohttp.ClientSession() as http:
        for path in ("/v1/responses", "/backend-api/codex/responses", "/v1/models", "/elsewhere"):
            async with http.post(proxy.url + path, json={"model": "gpt-5", "input": "hi"}, headers=SECRETS) as r:
                await r.read()
    assert len(emulator.requests) == 4
    assert _leaked(emulator) == []
    # Nothing else was lost: the body arrived.
    assert emulator.requests[0].json["input"] == "hi"


JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJTRUNSRVQifQ.U0VDUkVULXNpZ24"  # "SECRET" in every part


async def test_trusted_upstream_gets_api_keys_only(emulator, proxy_factory, monkeypatch):
    """`--trust-upstream` forwards an API key (and its org/project/cookie) to the gateway, never a ChatGPT
    sign-in: a JWT, a chatgpt-account-id, or a key mixed with one reach it with no credential (issue 31)."""
    monkeypatch.delenv("CTPROXY_UPSTREAM_API_KEY", raising=False)
    proxy = await proxy_factory(upstream=emulator.url, trust_upstream=True)
    api_key = {k: v for k, v in SECRETS.items() if k.lower() != "chatgpt-account-id"}
    sign_in = {"Authorization": f"Bearer {JWT}", "ChatGPT-Account-Id": "acct-SECRET-42"}
    async with aiohttp.ClientSession() as http:
        for path, headers in (("/v1/responses", api_key), ("/backend-api/codex/responses", sign_in),
                              ("/v1/responses", SECRETS), ("/backend-api/codex/responses", sign_in)):
            async with http.post(proxy.url + path, json={"model": "gpt-5", "input": "hi"}, headers=headers) as r:
                assert r.status == 200
            names = sorted(n.lower() for n, v in emulator.requests[-1].headers if "SECRET" in v)
            assert names == (sorted(k.lower() for k in api_key) if headers is api_key else [])
    assert len(emulator.requests) == 4


async def test_a_trusted_gateway_gets_its_own_key_for_a_sign_in(emulator, proxy_factory, monkeypatch):
    monkeypatch.setenv("CTPROXY_UPSTREAM_API_KEY", "gw-own-key")
    proxy = await proxy_factory(upstream=emulator.url, trust_upstream=True)
    async with aiohttp.ClientSession() as http, http.post(
            proxy.url + "/backend-api/codex/responses", json={"model": "gpt-5", "input": "hi"},
            headers={"Authorization": f"Bearer {JWT}", "ChatGPT-Account-Id": "acct-SECRET-42"}) as r:
        assert r.status == 200
    headers = {n.lower(): v for n, v in emulator.requests[-1].headers}
    assert headers["authorization"] == "Bearer gw-own-key" and "chatgpt-account-id" not in headers


async def test_regular_mode_strips_credentials_to_non_official_hosts(emulator, proxy_factory):
    proxy = await proxy_factory(mode="regular", with_tools=False)
    async with aiohttp.ClientSession() as http:
        async with http.post(emulator.url + "/v1/responses", json={"model": "gpt-5", "input": "hi"},
                             headers=SECRETS, proxy=proxy.url) as r:
            assert r.status == 200
        # A plain request without OpenAI credentials or paths passes untouched (it is not ours).
        async with http.get(emulator.url + "/static/x", headers={"Authorization": "Basic dXNlcjpwdw=="},
                            proxy=proxy.url) as r:
            await r.read()
    assert _leaked(emulator) == []
    assert ("Authorization", "Basic dXNlcjpwdw==") in emulator.requests[-1].headers


@pytest.mark.parametrize("debug", [False, True])
async def test_logs_hold_no_secrets(emulator, proxy_factory, debug):
    extra = ["--debug"] if debug else []
    proxy = await proxy_factory(upstream=emulator.url, trust_upstream=False, extra_args=extra)
    token = (proxy.state_dir / "token").read_text().strip()
    prompt = "PROMPT-TEXT-that-must-not-be-logged"
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/responses", json={"model": "gpt-5", "input": prompt, "stream": True},
                             headers=SECRETS) as r:
            await r.read()
        async with http.post(proxy.tools_url + "/v1/tools/get_context_remaining", json={},
                             headers={"Authorization": f"Bearer {token}"}) as r:
            await r.read()
        async with http.post(proxy.tools_url + "/v1/tools/get_context_remaining", json={},
                             headers={"Authorization": "Bearer wrong-SECRET-token"}) as r:
            assert r.status == 401
    await proxy.astop()
    log = proxy.log()
    assert "ctproxy ready" in log
    for needle in [token, prompt, "SECRET", "sk-live"]:
        assert needle not in log, needle
