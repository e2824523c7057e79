"""The `no_credentials` hint of a session whose credential is a ChatGPT sign-in toward a trusted gateway (seed 004
pipeline defect 6): it was told to make a model request first, which it had done and which cannot help (a
sign-in never goes to a gateway). The guard now hands over the refusal (no credential), and the tool says what
would help."""

from __future__ import annotations

from tests.proxy.upstream.test_credentials_relay import JWT, TASK, agent_request, send, setup  # noqa: F401 (a fixture)


async def test_a_sign_in_toward_a_trusted_gateway_gets_a_hint_that_can_help(setup, monkeypatch):  # noqa: F811
    srv, emu, guard = setup
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("CTPROXY_UPSTREAM_API_KEY", raising=False)
    flow = await send(guard, agent_request(emu, [("Authorization", f"Bearer {JWT}"), ("chatgpt-account-id", "acct"),
                                                 ("x-ctp-task", TASK)], path="/backend-api/codex/responses"))
    assert "authorization" not in flow.request.headers  # the sign-in never reaches the gateway
    access = srv.services.session_credentials.get(TASK, None)
    assert access is not None and access.headers == {} and not access.credentials_allowed
    res = await srv.rest("openai_generate_image", {"prompt": "x"}, task=TASK)
    assert res.details["error"] == "no_credentials"
    text = str(res.body)
    assert "make a model request" not in text
    assert "CTPROXY_UPSTREAM_API_KEY" in text and "sign in with ChatGPT" in text
    assert JWT not in text
    assert [r for r in emu.requests if r.route == "images"] == []
