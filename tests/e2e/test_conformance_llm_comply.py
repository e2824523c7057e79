"""`llm-comply` (PyPI; the Open Responses tests over HTTP, a suite nobody here wrote) against the validating
emulator directly, and through `ctproxy up` with its defaults and with the bridge (issue 44): every test that
passes directly passes through ctproxy. Through ctproxy web search is on by default, so the upstream sees a tool
the client never sent; the suite checks the answer's schema and what it echoes of the request."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import orjson
import pytest

from tests.emulator import Emulator
from tests.openapi_schema import spec_available

pytest.importorskip("llm_comply", reason="llm-comply is not installed (pyproject test extras)")
pytestmark = [pytest.mark.timeout(400),
              pytest.mark.skipif(not spec_available(), reason="the OpenAPI description (shared/compat) is not here")]


def _runner() -> str:
    here = Path(sys.executable).with_name("llm-comply")
    found = str(here) if here.exists() else shutil.which("llm-comply")
    if found is None:
        pytest.skip("the llm-comply command is not on PATH")
    return found


async def comply(base_url: str) -> dict[str, str]:
    """Each test's status (`passed`, `failed`, `skipped`) from `llm-comply run --json`."""
    proc = await asyncio.create_subprocess_exec(
        _runner(), "run", "-u", base_url, "-k", "sk-test-comply", "-m", "gpt-5", "--json", "--timeout", "60",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "NO_COLOR": "1"})
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    report = orjson.loads(out)
    statuses = {r["id"]: r["status"] for r in report["results"]}
    assert statuses, err.decode(errors="replace")
    return statuses


def _failures(statuses: dict[str, str]) -> list[str]:
    return sorted(t for t, s in statuses.items() if s == "failed")


async def test_llm_comply_passes_directly_and_through_ctproxy_with_defaults_and_the_bridge(proxy_factory):
    async with Emulator(validate_requests=True) as emu:
        direct = await comply(emu.url + "/v1")
        assert _failures(direct) == [], direct  # the emulator is the reference: where it fails, it is wrong
        passed = {t for t, s in direct.items() if s == "passed"}
        assert len(passed) >= 13

        proxy = await proxy_factory(upstream=emu.url)
        through = await comply(proxy.url + "/v1")
        assert sorted(t for t in passed if through.get(t) != "passed") == [], through
        searched = [r for r in emu.responses_requests if any(t.get("type") == "web_search"
                                                             for t in r.json.get("tools") or [])]
        assert searched  # defaults: the upstream got ctproxy's tool, the client never saw it

        bridged = await proxy_factory(upstream=emu.url, extra_args=["--bridge", "context,notes"])
        through = await comply(bridged.url + "/v1")
        assert sorted(t for t in passed if through.get(t) != "passed") == [], through
