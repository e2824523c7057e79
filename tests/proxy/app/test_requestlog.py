"""The request log (issue 17): one info line per request through `ctproxy up`, streaming or not, off with
`--quiet`, `--debug` limited to ctproxy's own loggers, and nothing secret in any of it."""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import pytest
from openai import AsyncOpenAI

from addons.requestlog import format_line, stages_of
from proxy.app.telemetry import RequestFeed, RequestRecord
from proxy.host.flowstate import FlowState

API_KEY = "sk-live-SECRET-request-log-key"
PROMPT = "PROMPT-TEXT-that-must-never-be-logged"
TOOL_ARG = "TOOL-ARGUMENT-that-must-never-be-logged"
LINE = re.compile(r"ctproxy-request (?P<method>\S+) (?P<path>\S+) (?P<status>\S+) (?P<ms>\d+)ms (?P<rest>.*)")


def _lines(log: str) -> list[re.Match[str]]:
    return [m for line in log.splitlines() if (m := LINE.search(line))]


async def _wait_lines(proxy, n: int, timeout: float = 30) -> list[re.Match[str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _lines(proxy.log())
        if len(found) >= n:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {n} request lines, log:\n{proxy.log()}")


def _client(proxy) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0)


async def test_one_line_per_request_streaming_and_not(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url)
    async with _client(proxy) as client:  # closed here: a client left open fails a later test's loop
        await client.responses.create(model="gpt-5", input=PROMPT)
        stream = await client.responses.create(model="gpt-5", input=PROMPT + " again", stream=True)
        async for _ in stream:
            pass
    async with aiohttp.ClientSession() as http, http.get(proxy.url + "/v1/models?secret=QUERY-SECRET") as r:
        await r.read()
    lines = await _wait_lines(proxy, 3)
    plain, streamed, models = lines[:3]
    assert (plain["method"], plain["path"], plain["status"]) == ("POST", "/v1/responses", "200")
    assert " buffered " in plain["rest"] and "model=gpt-5" in plain["rest"]
    assert (streamed["method"], streamed["path"], streamed["status"]) == ("POST", "/v1/responses", "200")
    assert " stream " in streamed["rest"] and "ttfb=" in streamed["rest"]
    out = re.search(r"out=(\d+)B", streamed["rest"])
    assert out is not None and int(out[1]) > 100  # the streamed bytes were counted
    assert "stages=" in streamed["rest"] and "session=" in streamed["rest"]
    assert models["path"] == "/v1/models"  # never the query string
    await proxy.astop()
    log = proxy.log()
    for needle in (API_KEY, PROMPT, "QUERY-SECRET", "SECRET"):
        assert needle not in log, needle


async def test_quiet_turns_the_log_off(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--quiet"])
    async with _client(proxy) as client:
        await client.responses.create(model="gpt-5", input="hello")
    async with aiohttp.ClientSession() as http:
        token = (proxy.state_dir / "token").read_text().strip()
        # The request is counted (metrics stay on) even though no line is printed.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            async with http.get(proxy.tools_url + "/metrics", headers={"Authorization": f"Bearer {token}"}) as r:
                if 'ctproxy_requests_total{method="POST",route="responses",status="200"} 1.0' in await r.text():
                    break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the request was not counted")
    await proxy.astop()
    assert _lines(proxy.log()) == []


async def test_debug_is_ctproxy_only_and_right_about_streaming(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--debug"])
    async with _client(proxy) as client:
        stream = await client.responses.create(model="gpt-5", input=PROMPT, stream=True)
        async for _ in stream:
            pass
    token = (proxy.state_dir / "token").read_text().strip()
    async with aiohttp.ClientSession() as http, http.post(
            proxy.tools_url + "/v1/tools/get_context_remaining", json={"note": TOOL_ARG},
            headers={"Authorization": f"Bearer {token}"}) as r:
        await r.read()
    lines = await _wait_lines(proxy, 1)
    assert " stream " in lines[0]["rest"]
    await proxy.astop()
    log = proxy.log()
    assert "ctproxy-debug" in log  # the features' debug lines are there
    for noisy in ("asyncio", "filelock", "mcp.server", "Using selector", "client connect", "server connect"):
        assert noisy not in log, noisy
    for needle in (API_KEY, PROMPT, TOOL_ARG, token):
        assert needle not in log, needle


def test_line_and_stages_hold_categories_only():
    st = FlowState()
    st.web_search = "native"
    st.body_limit = "passthrough"
    assert stages_of(st) == ["web_search", "body:passthrough"]
    rec = RequestRecord(id=1, at=0.0, method="POST", path="/v1/responses", route="responses", status=200, ms=12.3,
                        ttfb_ms=4.0, bytes_in=10, bytes_out=20, stream=True, model="gpt-5", session="abc",
                        stages=["web_search"])
    assert format_line(rec) == ("ctproxy-request POST /v1/responses 200 12ms ttfb=4ms stream model=gpt-5 in=10B "
                                "out=20B stages=web_search session=abc")


def test_feed_long_poll_returns_new_records():
    feed = RequestFeed(size=3)
    for _ in range(5):
        feed.publish(RequestRecord(id=feed.next_id(), at=0, method="GET", path="/", route="other", status=200,
                                   ms=1, ttfb_ms=None, bytes_in=0, bytes_out=0, stream=False))
    assert [r.id for r in feed.since(0)] == [3, 4, 5]  # bounded
    assert [r.id for r in feed.since(4)] == [5]
    assert feed.since(5, wait=0.01) == []


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/responses/compact", "/v1/models"])
def test_route_labels_are_a_closed_set(path):
    from proxy.metrics import route_label

    assert route_label(path) in ("responses", "compact", "other")


async def test_an_unreachable_upstream_is_one_line(proxy_factory):
    from tests.support.ports import closed_port

    body = {"model": "gpt-5", "input": PROMPT}
    with closed_port() as port:  # nothing listens there
        proxy = await proxy_factory(upstream=f"http://127.0.0.1:{port}")
        async with aiohttp.ClientSession() as http, http.post(proxy.url + "/v1/responses", json=body) as r:
            status = r.status
            await r.read()
    assert status >= 500
    await _wait_lines(proxy, 1)
    await proxy.astop()
    lines = _lines(proxy.log())
    assert len(lines) == 1, proxy.log()
    assert lines[0]["path"] == "/v1/responses" and lines[0]["status"] in (str(status), "upstream_failed")
    assert PROMPT not in proxy.log()


async def test_a_bridged_request_is_logged_under_the_agents_path_never_the_jobs_key(emulator, proxy_factory):
    """The bridge re-routes a request to `/ctp-bridge/<key>/v1/responses` inside the proxy; the key is a
    one-time secret of the job: the log line and the dashboard show the path the agent asked for."""
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context"])
    async with _client(proxy) as client:
        await client.responses.create(model="gpt-5", input=PROMPT)
    lines = await _wait_lines(proxy, 1)
    assert (lines[0]["method"], lines[0]["path"], lines[0]["status"]) == ("POST", "/v1/responses", "200")
    await proxy.astop()
    assert "ctp-bridge" not in proxy.log()


def test_stages_name_the_bootstrap_that_went_out_not_the_windows_strategy():
    """Seed 004 pipeline defect 5: after a remote checkpoint, a request whose fingerprint does not match goes
    out with the readable fallback; its line says so (it said `window:remote`)."""
    from proxy.windows.decision import WindowDecision
    from proxy.windows.remote.store import Checkpoint

    cp = Checkpoint(id="cp_1", session_key="s", created_at=0.0, strategy="remote", reason="threshold", boundary=2,
                    boundary_hash="h", marker="[m]", fallback_text="f", compaction_item=b"{}", retained=(),
                    fingerprint=None, usage=None)
    st = FlowState()
    st.window = WindowDecision(checkpoint=cp, replay_opaque=False, outcome="fallback")
    assert stages_of(st) == ["window:fallback"]
    st.window = WindowDecision(checkpoint=cp, replay_opaque=True, outcome="remote")
    assert stages_of(st) == ["window:remote"]
