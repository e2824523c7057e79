"""`/metrics` (issue 17): the tool server's numbers and the proxy's in one Prometheus text exposition,
parsed with the Prometheus client's own parser; counters move as requests and tool calls pass."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from proxy.app.telemetry import RequestFeed, TelemetryServer
from proxy.metrics import Observed, ProxyMetrics


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def _scrape(http: aiohttp.ClientSession, proxy, token: str):
    async with http.get(proxy.tools_url + "/metrics", headers={"Authorization": f"Bearer {token}"}) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return _samples(await r.text())


async def _until(http, proxy, token, check, timeout: float = 30):
    deadline = time.monotonic() + timeout
    samples = None
    while time.monotonic() < deadline:
        samples = await _scrape(http, proxy, token)
        if check(samples):
            return samples
        await asyncio.sleep(0.1)
    raise AssertionError(f"metrics never matched: {samples}")


async def test_counters_move_as_requests_pass(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url)
    token = (proxy.state_dir / "token").read_text().strip()
    client = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
    await client.responses.create(model="gpt-5", input="one")
    stream = await client.responses.create(model="gpt-5", input="two", stream=True)
    async for _ in stream:
        pass
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.tools_url + "/v1/tools/get_context_remaining", json={},
                             headers={"Authorization": f"Bearer {token}", "x-ctp-task": _task(proxy)}) as r:
            assert r.status == 200 and (await r.json())["ok"]
        async with http.post(proxy.tools_url + "/v1/tools/no_such_tool", json={},
                             headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 404
        ok = dict(route="responses", method="POST", status="200")
        s = await _until(http, proxy, token, lambda s: _value(s, "ctproxy_requests_total", **ok) == 2)
        assert _value(s, "ctproxy_request_duration_seconds_count", route="responses") == 2
        assert _value(s, "ctproxy_request_ttfb_seconds_count", route="responses") == 2
        assert _value(s, "ctproxy_request_bytes_total", route="responses", direction="in") > 0
        assert _value(s, "ctproxy_request_bytes_total", route="responses", direction="out") > 0
        assert _value(s, "ctproxy_tool_calls_total", tool="get_context_remaining", transport="rest", outcome="ok") == 1
        assert _value(s, "ctproxy_tool_calls_total", tool="unknown", transport="rest", outcome="refused") == 1
        assert _value(s, "ctproxy_proxy_telemetry_up") == 1
        assert ("ctproxy_journal_writer_backlog", ()) in s
        assert _value(s, "ctproxy_request_errors_total", route="responses", status="200") == 0
        # An upstream error is a request and an error.
        async with http.post(proxy.url + "/v1/models/none", data=b"x") as r:
            status = r.status
        s = await _until(http, proxy, token, lambda s: _value(s, "ctproxy_request_errors_total", route="other",
                                                              status=str(status)) == 1)
        await client.responses.create(model="gpt-5", input="three")
        await _until(http, proxy, token, lambda s: _value(s, "ctproxy_requests_total", **ok) == 3)
    await client.close()


async def test_metrics_need_the_token_and_refuse_browsers(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url)
    token = (proxy.state_dir / "token").read_text().strip()
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.tools_url + "/metrics") as r:
            assert r.status == 401
        async with http.get(proxy.tools_url + "/metrics", headers={"Authorization": f"Bearer {token}",
                                                                   "Origin": "http://evil.example"}) as r:
            assert r.status == 403


async def test_no_metrics_leaves_the_tool_servers_own(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--no-metrics"])
    token = (proxy.state_dir / "token").read_text().strip()
    async with AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0) as client:
        await client.responses.create(model="gpt-5", input="x")
    async with aiohttp.ClientSession() as http:
        s = await _scrape(http, proxy, token)
    assert _value(s, "ctproxy_proxy_telemetry_up") == 0
    assert not any(name.startswith("ctproxy_requests") for name, _ in s)


def test_stage_methods_and_label_hygiene():
    m = ProxyMetrics()
    m.compaction("remote", "threshold")
    m.rollover("notes")
    m.overflow_recovery("recovered")
    m.bridged_round()
    m.bridged_round("failed")
    m.rollover("free text with spaces")  # a label is never free text
    m.observe_request(Observed(route="/v1/odd", method="BREW", status=None, seconds=0.5, ttfb_seconds=None,
                               bytes_in=0, bytes_out=None))
    m.watch_journal_backlog(lambda: 7)
    s = _samples(m.render().decode())
    assert _value(s, "ctproxy_compactions_total", strategy="remote", trigger="threshold") == 1
    assert _value(s, "ctproxy_rollovers_total", strategy="notes") == 1
    assert _value(s, "ctproxy_rollovers_total", strategy="other") == 1
    assert _value(s, "ctproxy_overflow_recoveries_total", outcome="recovered") == 1
    assert _value(s, "ctproxy_bridged_rounds_total", outcome="ok") == 1
    assert _value(s, "ctproxy_bridged_rounds_total", outcome="failed") == 1
    assert _value(s, "ctproxy_requests_total", route="other", method="OTHER", status="error") == 1
    assert _value(s, "ctproxy_request_errors_total", route="other", status="error") == 1
    assert _value(s, "ctproxy_journal_writer_backlog") == 7


@pytest.mark.parametrize("headers,status", [
    ({}, 401),
    ({"Authorization": "Bearer wrong"}, 401),
    ({"Authorization": "Bearer T0KEN", "Origin": "http://127.0.0.1"}, 403),
    ({"Authorization": "Bearer T0KEN", "Host": "evil.example"}, 403),
    ({"Authorization": "Bearer T0KEN"}, 200),
])
async def test_proxy_telemetry_port_rules(headers, status):
    server = TelemetryServer("T0KEN", ProxyMetrics(), RequestFeed()).start()
    try:
        async with aiohttp.ClientSession() as http, http.get(server.url + "/requests", headers=headers) as r:
            assert r.status == status
    finally:
        server.stop()


def _task(proxy) -> str:
    """A task of the proxy's state (what `ctproxy task new` makes): get_context_remaining needs one."""
    from proxy.journal import Journal
    from proxy.state import StateDir

    j = Journal(StateDir.open(proxy.state_dir))
    try:
        return j.create_task()
    finally:
        j.close()


async def test_bridged_rounds_and_bridged_tool_calls_are_counted(emulator, proxy_factory):
    from tests.emulator import FunctionCall, Text

    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context"])
    token = (proxy.state_dir / "token").read_text().strip()
    client = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
    emulator.script(FunctionCall("get_context_remaining", {}, call_id="call_m1"), Text("done"))
    resp = await client.responses.create(model="gpt-5", input="how much is left?")
    assert [o.type for o in resp.output] == ["mcp_call", "message"]
    async with aiohttp.ClientSession() as http:
        s = await _until(http, proxy, token, lambda s: _value(s, "ctproxy_bridged_rounds_total", outcome="ok") == 1)
        assert sum(v for (name, labels), v in s.items() if name == "ctproxy_tool_calls_total"
                   and dict(labels).get("tool") == "get_context_remaining"
                   and dict(labels).get("transport") == "bridge") == 1
    await client.close()


async def test_every_overflow_recovery_is_counted_with_its_outcome(emulator, proxy_factory):
    from tests.emulator import Text, context_length_exceeded_400

    proxy = await proxy_factory(upstream=emulator.url)
    token = (proxy.state_dir / "token").read_text().strip()
    client = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
    history = [{"role": "user", "content": f"turn {i} " + "x" * 2_000} for i in range(6)]
    emulator.script(context_length_exceeded_400(), Text("fits now"), Text("fits now"))
    try:
        await client.responses.create(model="gpt-5", input=history)
    except Exception:  # the agent gets the original error when recovery cannot help: counted all the same
        pass
    async with aiohttp.ClientSession() as http:
        s = await _until(http, proxy, token, lambda s: sum(
            v for (name, _labels), v in s.items() if name == "ctproxy_overflow_recoveries_total") == 1)
        outcomes = {dict(labels)["outcome"] for (name, labels), v in s.items()
                    if name == "ctproxy_overflow_recoveries_total" and v}
        assert outcomes <= {"recovered", "retry_failed", "not_smaller", "skipped"}, outcomes
    await client.close()
