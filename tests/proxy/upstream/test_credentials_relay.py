"""The credential source of MCP/REST calls (issue 15): the guard hands a session's credentials to the tool
server (proxy/upstream/relay.py → PUT /v1/credentials) only for what it let through, and the tools use them
for that session only. Real guard, real tool server on loopback, the emulator as a trusted upstream."""

from __future__ import annotations

import pytest
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow, tutils

from addons.codex_backend import CodexBackend
from addons.guard import Guard
from proxy.app import runtime
from proxy.host.flowstate import state_of
from proxy.routes import Route
from proxy.upstream.relay import base_url_of, offer_of
from tests.emulator import Emulator

API_KEY = "sk-relay-0123456789abcdef"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJyZWxheSJ9.c2lnbmF0dXJlLXJlbGF5"
TASK = "task_relay"


def test_base_url_of():
    assert base_url_of("https", "api.openai.com", 443, "/v1/responses") == ("https://api.openai.com/v1", "api")
    assert base_url_of("https", "chatgpt.com", 443, "/backend-api/codex/responses?x=1") == (
        "https://chatgpt.com/backend-api/codex", "codex")
    assert base_url_of("http", "127.0.0.1", 8080, "/gw/v1/responses") == ("http://127.0.0.1:8080/gw/v1", "api")
    assert base_url_of("https", "api.openai.com", 443, "/other") is None


def test_offer_needs_a_task_and_an_authorization_and_carries_only_the_credential():
    headers = {"Authorization": f"Bearer {API_KEY}", "Cookie": "c=1", "x-other": "y"}
    assert offer_of(None, None, "https", "api.openai.com", 443, "/v1/responses", headers, True) is None
    assert offer_of(TASK, None, "https", "api.openai.com", 443, "/v1/responses", {"Cookie": "c"}, True) is None
    offer = offer_of(TASK, "/root/a", "https", "api.openai.com", 443, "/v1/responses", headers, True)
    assert offer is not None and offer.headers == {"authorization": f"Bearer {API_KEY}"}
    assert API_KEY not in repr(offer)


@pytest.fixture
async def setup(tool_server, emulator: Emulator):
    srv = await tool_server({"image_generation.enabled": True})
    rt = runtime.build(state_dir=str(srv.services.state.root), upstream=emulator.url, trust_upstream=True)
    runtime.install(rt)
    guard = Guard()
    with taddons.context(guard, CodexBackend()) as tctx:
        tctx.options.update(ctp_tools_url=srv.url)
        yield srv, emulator, guard
    if guard._relay is not None:
        await guard._relay.close()
    runtime.uninstall()


def agent_request(emu: Emulator | None, headers, path="/v1/responses", trusted=True, official=False):
    if official:
        scheme, host, port = "https", "api.openai.com" if path.startswith("/v1") else "chatgpt.com", 443
    else:
        scheme, host, port = "http", emu.host, emu.port
    req = tutils.treq(method=b"POST", scheme=scheme.encode(), host=host, port=port, path=path.encode(),
                      content=b'{"model":"gpt-5","input":"hi"}',
                      headers=((b"content-type", b"application/json"),
                               *((k.encode(), v.encode()) for k, v in headers)))
    flow = tflow.tflow(req=req)
    flow.client_conn.proxy_mode = ProxyMode.parse(f"reverse:{scheme}://{host}:{port}")
    kind = "codex" if "/backend-api/codex" in path else "api"
    state_of(flow).route = Route(kind=kind, official=official, trusted=trusted and not official)
    return flow


async def send(guard, flow):
    guard.request(flow)
    if guard._relay is not None:
        await guard._relay.drain()
    return flow


async def test_a_request_through_the_proxy_gives_its_session_credentials_to_rest_and_mcp(setup):
    srv, emu, guard = setup
    await send(guard, agent_request(emu, [("Authorization", f"Bearer {API_KEY}"), ("x-ctp-task", TASK)]))
    assert guard._relay.handed_over == 1 and len(srv.services.session_credentials) == 1
    res = await srv.rest("openai_generate_image", {"prompt": "a cat"}, task=TASK)
    assert res.ok and res.details["credential_source"] == "session", res.body
    res = await srv.mcp("openai_generate_image", {"prompt": "a dog"}, task=TASK)
    assert not res.is_error, res.text
    reqs = [r for r in emu.requests if r.route == "images"]
    assert [dict((k.lower(), v) for k, v in r.headers)["authorization"] for r in reqs] == [f"Bearer {API_KEY}"] * 2
    assert all(r.path == "/v1/images/generations" for r in reqs)


async def test_unchanged_credentials_are_handed_over_once_and_a_new_token_again(setup):
    srv, emu, guard = setup
    for _ in range(3):
        await send(guard, agent_request(emu, [("Authorization", f"Bearer {API_KEY}"), ("x-ctp-task", TASK)]))
    assert guard._relay.handed_over == 1
    await send(guard, agent_request(emu, [("Authorization", "Bearer sk-refreshed"), ("x-ctp-task", TASK)]))
    assert guard._relay.handed_over == 2
    await srv.rest("openai_generate_image", {"prompt": "x"}, task=TASK)
    [req] = [r for r in emu.requests if r.route == "images"]
    assert dict((k.lower(), v) for k, v in req.headers)["authorization"] == "Bearer sk-refreshed"


async def test_an_untrusted_upstream_never_gives_credentials(setup, monkeypatch):
    srv, emu, guard = setup
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    flow = await send(guard, agent_request(emu, [("Authorization", f"Bearer {API_KEY}"), ("x-ctp-task", TASK)],
                                           trusted=False))
    assert "authorization" not in flow.request.headers  # stripped on its way out
    assert guard._relay is None or guard._relay.handed_over == 0
    assert len(srv.services.session_credentials) == 0
    res = await srv.rest("openai_generate_image", {"prompt": "x"}, task=TASK)
    assert res.details["error"] == "no_credentials"


async def test_a_kind_mismatch_is_refused_and_never_handed_over(setup):
    _srv, _emu, guard = setup
    flow = await send(guard, agent_request(None, [("Authorization", f"Bearer {API_KEY}"), ("x-ctp-task", TASK)],
                                           path="/backend-api/codex/responses", official=True))
    assert flow.response is not None and flow.response.status_code == 403
    assert guard._relay is None or guard._relay.handed_over == 0


async def test_official_route_credentials_are_kept_for_the_official_endpoint(setup):
    srv, _emu, guard = setup
    await send(guard, agent_request(None, [("Authorization", f"Bearer {JWT}"), ("chatgpt-account-id", "acct"),
                                           ("x-ctp-task", TASK)], path="/backend-api/codex/responses", official=True))
    assert guard._relay.handed_over == 1
    access = srv.services.session_credentials.get(TASK, None)
    assert access.base_url == "https://chatgpt.com/backend-api/codex" and access.official
    assert access.headers == {"authorization": f"Bearer {JWT}", "chatgpt-account-id": "acct"}
    assert JWT not in repr(access) and JWT not in repr(srv.services.session_credentials)


async def test_requests_without_a_task_or_not_a_model_turn_are_not_handed_over(setup):
    srv, emu, guard = setup
    await send(guard, agent_request(emu, [("Authorization", f"Bearer {API_KEY}")]))
    await send(guard, agent_request(emu, [("Authorization", f"Bearer {API_KEY}"), ("x-ctp-task", TASK)],
                                    path="/v1/files"))
    assert guard._relay is None or guard._relay.handed_over == 0
    assert len(srv.services.session_credentials) == 0


def test_a_trusted_upstream_with_a_path_prefix_is_cleared_under_its_base_only():
    from tools_server.credentials import Resolved

    r = Resolved("http://127.0.0.1:9/gw/v1", "api", False, "session", "api_key", {"authorization": "Bearer sk-x"})
    assert r.cleared_for(r.url("images/generations"))
    assert not r.cleared_for("http://127.0.0.1:9/other/v1/images/generations")
    assert not r.cleared_for("http://evil.example/gw/v1/images/generations")
    official = Resolved("https://api.openai.com/v1", "api", True, "session", "api_key",
                        {"authorization": "Bearer sk-x"})
    assert official.cleared_for(official.url("responses"))
    wrong = Resolved("https://api.openai.com/v1", "api", True, "session", "chatgpt", {"authorization": f"Bearer {JWT}"})
    assert not wrong.cleared_for(wrong.url("responses"))  # kind matches host, checked again before sending
