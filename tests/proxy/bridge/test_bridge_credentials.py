"""Bridged rounds follow the one credential rule (proxy.routes.may_receive_credentials, issue 12): a trusted
upstream gets the agent's credentials on every round; an untrusted one on none, and neither does the
loopback hop inside ctproxy (the job keeps them in memory)."""

from __future__ import annotations

import openai
import pytest

from tests.emulator import FunctionCall, Text

pytestmark = pytest.mark.timeout(120)


def _auth(rec) -> str | None:
    return next((v for k, v in rec.headers if k.lower() == "authorization"), None)


@pytest.mark.parametrize("trusted", [True, False])
async def test_rounds_follow_the_credential_rule(emulator, proxy_factory, trusted):
    proxy = await proxy_factory(upstream=emulator.url, trust_upstream=trusted, extra_args=["--bridge", "context"])
    emulator.script(FunctionCall("get_context_remaining", {}), Text("done"))
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-bridge-secret", max_retries=0)
    async with c.responses.stream(model="gpt-4.1", input="x") as stream:
        final = await stream.get_final_response()
    assert final.output_text == "done"
    rounds = emulator.responses_requests
    assert len(rounds) == 2
    want = "Bearer sk-bridge-secret" if trusted else None
    assert [_auth(r) for r in rounds] == [want, want]
    assert "sk-bridge-secret" not in proxy.log()


JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJicmlkZ2UifQ.c2lnbmF0dXJlLWJyaWRnZQ"


async def test_a_sign_in_never_reaches_a_trusted_gateway_on_any_round(emulator, proxy_factory, monkeypatch):
    """Issue 31 / defect 4: ctproxy's own rounds follow the rule too: a ChatGPT sign-in is taken off every
    round to a gateway, trusted or not."""
    monkeypatch.delenv("CTPROXY_UPSTREAM_API_KEY", raising=False)
    proxy = await proxy_factory(upstream=emulator.url, trust_upstream=True, extra_args=["--bridge", "context"])
    emulator.script(FunctionCall("get_context_remaining", {}), Text("done"))
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key=JWT, max_retries=0,
                           default_headers={"chatgpt-account-id": "acct-bridge"})
    async with c.responses.stream(model="gpt-4.1", input="x") as stream:
        final = await stream.get_final_response()
    assert final.output_text == "done"
    rounds = emulator.responses_requests
    assert len(rounds) == 2
    for r in rounds:
        names = {k.lower() for k, _ in r.headers}
        assert "authorization" not in names and "chatgpt-account-id" not in names

