"""One search path per turn (issue 15): the bridge offers the sidecar `openai_web_search` only when
`search_path(web_search, route.eligible)` says `sidecar`. With `web_search.backend auto` and an executor
model, an eligible (trusted) route searches natively (the hosted tool, no sidecar); a route that is not
eligible gets the sidecar tool and no hosted tool; backend `sidecar` offers it everywhere."""

from __future__ import annotations

import openai
import pytest

from tests.emulator import Text
from tests.support.cli import ctproxy

pytestmark = pytest.mark.timeout(120)
SIDECAR = "openai_web_search"


def configure(state_dir, **values: str) -> None:
    for key, value in values.items():
        ctproxy("config", "set", "--state-dir", str(state_dir), key, value, timeout=60, check=True)


async def tools_of_one_request(emulator, proxy_factory, tmp_path, *, trust: bool, backend: str) -> list[str]:
    state = tmp_path / f"state-{backend}-{trust}"
    configure(state, **{"web_search.enabled": "true", "web_search.backend": backend,
                        "web_search.sidecar_model": "gpt-4.1-mini"})
    proxy = await proxy_factory(upstream=emulator.url, trust_upstream=trust, state_dir=state,
                                extra_args=["--bridge", "sidecar_search,context"])
    emulator.script(Text("ok"))
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-search-path", max_retries=0)
    await c.responses.create(model="gpt-4.1", input="what happened today?")
    await c.close()
    return [t.get("name") or t["type"] for t in emulator.responses_requests[-1].json.get("tools") or []]


async def test_auto_on_an_eligible_route_searches_natively_only(emulator, proxy_factory, tmp_path):
    names = await tools_of_one_request(emulator, proxy_factory, tmp_path, trust=True, backend="auto")
    assert "web_search" in names and SIDECAR not in names
    assert "get_context_remaining" in names  # the other bridged tools are still offered


async def test_auto_off_an_eligible_route_offers_the_sidecar_only(emulator, proxy_factory, tmp_path):
    names = await tools_of_one_request(emulator, proxy_factory, tmp_path, trust=False, backend="auto")
    assert SIDECAR in names and "web_search" not in names


async def test_backend_sidecar_offers_it_on_an_eligible_route(emulator, proxy_factory, tmp_path):
    names = await tools_of_one_request(emulator, proxy_factory, tmp_path, trust=True, backend="sidecar")
    assert SIDECAR in names and "web_search" not in names
