"""End to end through `ctproxy up`: transparency, streaming, the openai SDK."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import orjson

from tests.emulator import Text

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"}


def _headers_without(headers, drop: set[str]) -> list[tuple[str, str]]:
    return [(k.lower(), v) for k, v in headers if k.lower() not in drop]


async def test_all_features_off_is_byte_identical(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=[
        "--disable", "web_search", "--disable", "history", "--disable", "context", "--disable", "notes"])
    # A JSON Responses body with odd spacing, unknown fields and key order that a re-serializer would change.
    body = b'{"model":"gpt-5",  "input":[{"role":"user","content":"hi"}], "zz_unknown":{"b":1,"a":[1.0,2e3]}}'
    sent_headers = {"Authorization": "Bearer sk-test-123", "Content-Type": "application/json",
                    "X-Custom": "kept", "x-ctp-task": "", "OpenAI-Beta": "responses=v1"}
    cases = [
        ("POST", "/v1/responses", body, sent_headers),
        ("POST", "/v1/responses", b"\x00\x01not json at all\xff", {"Content-Type": "application/octet-stream"}),
        ("POST", "/v1/responses", b'{"broken": ', {"Content-Type": "application/json"}),
        ("POST", "/v1/embeddings", b'{"model":"x","input":"y"}', {"Content-Type": "application/json"}),
        ("GET", "/v1/models?limit=2", b"", {"Accept": "application/json"}),
    ]
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        for method, path, data, headers in cases:
            before = len(emulator.requests)
            async with http.request(method, proxy.url + path, data=data, headers=headers) as resp:
                got = await resp.read()
                status = resp.status
            rec = emulator.requests[before]
            assert rec.body == data, (method, path)
            assert rec.path == path.split("?")[0]
            expected = _headers_without(headers.items(), {"host", "x-ctp-task"} | HOP_BY_HOP)
            received = _headers_without(rec.headers, {"host", "content-length", "accept-encoding", "user-agent",
                                                      "accept"} | HOP_BY_HOP)
            for item in expected:
                assert item in received or item[0] in ("accept",), (item, received)
            assert not any(k.lower().startswith("x-ctp-") for k, _ in rec.headers), (method, path, rec.headers)
            # The client gets the upstream's bytes.
            direct = await _direct(http, emulator, method, path, data, headers)
            if path != "/v1/responses" or data != body:
                assert got == direct[1] and status == direct[0]


async def _direct(http, emulator, method, path, data, headers):
    async with http.request(method, emulator.url + path, data=data, headers=headers) as resp:
        return resp.status, await resp.read()


async def test_first_sse_event_arrives_before_upstream_pause_ends(emulator, proxy):
    emulator.script(Text("hello world", deltas=4, pause_after_first=2.0))
    start = time.monotonic()
    first_at = None
    chunks = []
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses", json={"model": "gpt-5", "input": "hi", "stream": True},
        headers={"Authorization": "Bearer sk-x"},
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for chunk in resp.content.iter_any():
            if first_at is None and b"response.created" in chunk:
                first_at = time.monotonic() - start
            chunks.append(chunk)
    total = time.monotonic() - start
    assert first_at is not None
    # Ordering, not speed: the first event was already here while the upstream was still pausing.
    assert first_at < total - 1.0
    assert b"response.completed" in b"".join(chunks)


async def test_openai_sdk_streaming_and_not(emulator, proxy):
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
    resp = await client.responses.create(model="gpt-5", input="ping")
    assert resp.output_text.startswith("You said: ping")
    events = []
    stream = await client.responses.create(model="gpt-5", input="stream me", stream=True)
    async for ev in stream:
        events.append(ev.type)
    assert events[0] == "response.created" and events[-1] == "response.completed"
    await client.close()


async def test_midstream_disconnect_reaches_client(emulator, proxy):
    emulator.script(Text("a b c d e f", deltas=6, disconnect_after=4))
    async with aiohttp.ClientSession() as http:
        got = b""
        try:
            async with http.post(proxy.url + "/v1/responses", json={"model": "gpt-5", "input": "x", "stream": True},
                                 timeout=aiohttp.ClientTimeout(total=20)) as resp:
                async for chunk in resp.content.iter_any():
                    got += chunk
            raised = False
        except aiohttp.ClientPayloadError:
            raised = True
    assert b"response.completed" not in got
    assert raised, "the client must see the broken stream as an error, not a clean end"


async def test_get_context_remaining_after_a_turn(emulator, proxy):
    from proxy.journal import Journal
    from proxy.state import StateDir

    token = (proxy.state_dir / "token").read_text().strip()
    j = Journal(StateDir.open(proxy.state_dir))
    task = j.create_task()  # what `ctproxy task new` does: get_context_remaining answers for a task's agent
    j.close()
    hdrs = {"Authorization": f"Bearer {token}", "x-ctp-task": task, "x-ctp-agent": "/root"}
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.tools_url + "/v1/tools/get_context_remaining", json={}, headers=hdrs) as r:
            assert (await r.json())["details"]["state"] == "unknown"
        async with http.post(proxy.url + "/v1/responses", json={"model": "gpt-5", "input": "hello"},
                             headers={"x-ctp-task": task, "x-ctp-agent": "/root"}) as r:
            usage = (await r.json())["usage"]
        for _ in range(50):
            async with http.post(proxy.tools_url + "/v1/tools/get_context_remaining", json={}, headers=hdrs) as r:
                details = (await r.json())["details"]
            if details["state"] != "unknown":
                break
            await asyncio.sleep(0.1)
    assert details["used_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert details["window_tokens_left"] == 272_000 - usage["input_tokens"] - usage["output_tokens"]
    _ = orjson
