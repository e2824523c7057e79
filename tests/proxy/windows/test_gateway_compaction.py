"""Compaction's own call toward a trusted gateway carries the gateway's key (seed 004 pipeline defect 4): a client
signed in with ChatGPT reaches a `--trust-upstream` gateway with `CTPROXY_UPSTREAM_API_KEY`, never its sign-in;
the remote compaction call beside its turns gets the same key (it went with none, and a gateway that checks
its key answered 401, so every compaction fell back)."""

from __future__ import annotations

import aiohttp
import pytest

from tests.e2e.test_compaction_e2e import compaction_requests, drive_codex_session, turn_requests
from tests.emulator import Emulator
from tests.proxy.windows.test_compaction_harness import running_proxy

pytestmark = pytest.mark.timeout(240)

CONFIG = {"remote_compaction": {"enabled": True}, "model_windows": {"gpt-test*": 20_000, "*": 128_000},
          "context": {"enabled": False}, "web_search": {"enabled": False}}


async def test_the_compaction_call_to_a_trusted_gateway_carries_the_gateway_key(tmp_path, monkeypatch):
    monkeypatch.setenv("CTPROXY_UPSTREAM_API_KEY", "sk-GW-0123456789")
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, CONFIG, monkeypatch) as base, \
            aiohttp.ClientSession() as http:
        await drive_codex_session(http, base, emu, range(1, 14))
        comps = compaction_requests(emu)
        assert len(comps) == 1, [r.route for r in emu.requests]
        for req in [*turn_requests(emu), comps[0]]:
            headers = {k.lower(): v for k, v in req.headers}
            assert headers.get("authorization") == "Bearer sk-GW-0123456789", (req.route, headers)
            assert "chatgpt-account-id" not in headers
