"""Web search through `ctproxy up` in front of the validating emulator, with the `openai` SDK and the tool
server's REST listing (issue 31): the client's per-request switch, the client's tool_choice and tool names
left as they mean, and the sidecar listed only where `auto` does not search natively."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from proxy.state import StateDir
from tests.emulator import Emulator, Text
from tests.openapi_schema import spec_available

pytestmark = pytest.mark.timeout(180)
FN = {"type": "function", "name": "get_weather", "strict": True,
      "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False}}


@pytest.fixture
async def emu():
    async with Emulator(validate_requests=spec_available()) as emulator:
        emulator.set_default(Text("ok"))
        yield emulator


def tools_of(rec) -> list:
    return rec.json.get("tools") or []


def hosted(rec) -> int:
    return sum(1 for t in tools_of(rec) if t.get("type") == "web_search")


async def test_the_client_switch_the_tool_choice_and_a_web_search_function(emu, proxy_factory):
    proxy = await proxy_factory(upstream=emu.url, extra_args=["--enable", "web_search"])
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-search", max_retries=0)
    await c.responses.create(model="gpt-5", input="hi")
    await c.responses.create(model="gpt-5", input="hi", extra_headers={"x-ctp-web-search": "off"})
    await c.responses.create(model="gpt-5", input="hi", extra_headers={"x-ctp-web-search": "ON"})
    await c.responses.create(model="gpt-5", input="hi", tools=[FN], tool_choice="required")
    await c.responses.create(model="gpt-5", input="hi", tools=[FN],
                             tool_choice={"type": "function", "name": "get_weather"})
    await c.responses.create(model="gpt-5", input="hi", tools=[{**FN, "name": "web_search"}])
    with pytest.raises(openai.BadRequestError) as bad:
        await c.responses.create(model="gpt-5", input="hi", extra_headers={"x-ctp-web-search": "maybe"})
    assert bad.value.code == "invalid_web_search_switch" and "x-ctp-web-search" in bad.value.message
    reqs = emu.responses_requests
    assert len(reqs) == 6 and all(r.status == 200 for r in reqs)  # the bad switch never left the proxy
    assert [hosted(r) for r in reqs] == [1, 0, 1, 0, 0, 0]
    assert "include" not in reqs[1].json  # off: the request as the client sent it
    assert reqs[3].json["tool_choice"] == "required" and tools_of(reqs[3]) == [FN]
    assert [t["name"] for t in tools_of(reqs[5])] == ["web_search"]  # the client's function, not renamed
    for r in reqs:
        assert not [k for k, _ in r.headers if k.lower().startswith("x-ctp-")]


async def listed(proxy) -> set[str]:
    token = StateDir.open(proxy.state_dir).token()
    async with aiohttp.ClientSession() as http, http.get(f"{proxy.tools_url}/v1/tools",
                                                         headers={"Authorization": f"Bearer {token}"}) as r:
        assert r.status == 200
        body = await r.json()
    return {t["name"] for t in body["data"]}


@pytest.mark.parametrize(("backend", "trusted", "listed_there"), [
    ("auto", True, False),   # defect 7: auto is native toward an eligible upstream, no sidecar there
    ("auto", False, True),   # untrusted: no native, the sidecar searches
    ("sidecar", True, True),  # the user chose the sidecar
])
async def test_the_sidecar_is_listed_only_where_auto_does_not_search_natively(emu, proxy_factory, tmp_path,
                                                                              backend, trusted, listed_there):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"web_search": {"enabled": True, "backend": backend, "sidecar_model": "gpt-5-mini"}}))
    # Behind an untrusted upstream the sidecar can only pay with OPENAI_API_KEY (without it: unavailable, issue 27).
    proxy = await proxy_factory(upstream=emu.url, trust_upstream=trusted, extra_args=["--config", str(cfg)],
                                env={"OPENAI_API_KEY": "sk-env-not-real"})
    assert ("openai_web_search" in await listed(proxy)) is listed_there
