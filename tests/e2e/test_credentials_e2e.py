"""End to end (issue 15): `ctproxy up` in front of the emulator (trusted). An agent's model request with
x-ctp-task hands its credentials to the tool server; an image call over REST for that task then uses them,
and nothing about the key, the prompt or the image shows in `--debug` output."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import pytest

from proxy.app.journal_views import new_task
from proxy.state import StateDir
from tests.emulator import Emulator
from tests.emulator.images import png_bytes

API_KEY = "sk-e2e-credentials-0123456789abcdef"
PROMPT = "an origami heron, e2e-secret-prompt-55aa"


@pytest.mark.parametrize("bridge", [[], ["--bridge", "history"]], ids=["bridge-off", "bridge-on"])
async def test_model_request_then_rest_image_call_uses_its_credentials(emulator: Emulator, proxy_factory, monkeypatch,
                                                                       bridge):
    """With the bridge on, the request leaves through the bridge's job (its credentials taken off the
    request): the session's hand-over still happens (issue 31)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--enable", "image_generation", "--debug", *bridge],
                                env={"OPENAI_API_KEY": ""})
    state = StateDir.open(proxy.state_dir)
    token, task = state.token(), new_task(state)
    tool_headers = {"Authorization": f"Bearer {token}", "x-ctp-task": task}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.url}/v1/responses", json={"model": "gpt-5", "input": "hello"},
                             headers={"Authorization": f"Bearer {API_KEY}", "x-ctp-task": task}) as resp:
            assert resp.status == 200, await resp.text()
        # the hand-over runs in the background: wait for its effect, with a generous bound
        body: dict = {}
        async with asyncio.timeout(30):
            while True:
                async with http.post(f"{proxy.tools_url}/v1/tools/openai_generate_image", json={"prompt": PROMPT},
                                     headers=tool_headers) as resp:
                    body = await resp.json()
                if body.get("ok") or body.get("details", {}).get("error") != "no_credentials":
                    break
                await asyncio.sleep(0.1)
    assert body["ok"], body
    assert body["details"]["credential_source"] == "session"
    [req] = [r for r in emulator.requests if r.route == "images"]
    assert dict((k.lower(), v) for k, v in req.headers)["authorization"] == f"Bearer {API_KEY}"
    assert base64.b64decode(body["images"][0]["data"]) == png_bytes()
    await proxy.astop()
    log = proxy.log()
    assert "openai_generate_image upstream outcome=answered" in log  # the debug line is there, with no payload
    for secret in (API_KEY, PROMPT, "origami", body["images"][0]["data"][:40]):
        assert secret not in log
