"""A bridged request's first round goes upstream the moment its body is final, and its request to the
loopback endpoint carries no body (issue 12: a request that needs no bridged call keeps its TTFB; ADR 0007).

Through `ctproxy up --bridge context` (mitmproxy, the chain, the endpoint) against the emulator; the
endpoint alone (`BridgeService`) for what mitmproxy cannot be made to do on cue: a request that never
arrives, one that is not the launched one."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import orjson
import pytest

from proxy.bridge import server as bridge_server
from proxy.bridge.server import BridgeService
from proxy.bridge.specs import Offer
from proxy.bridge.turn import BridgeJob
from proxy.toolclient import ToolClient
from proxy.upstream import UpstreamTurns
from tests.emulator import Raw, Text, context_length_exceeded_400
from tests.proxy.bridge.test_bridge_passthrough import MSG, events, openai_bytes

pytestmark = pytest.mark.timeout(120)

LAUNCHED = "round 1 sent upstream when the body was written"
TAKEN = "the endpoint took its launched round 1"


async def bridged_proxy(emulator, proxy_factory, tmp_path, config: dict | None = None):
    cfg = tmp_path / "bridge-launch.json"
    cfg.write_text(json.dumps(config or {}))
    return await proxy_factory(upstream=emulator.url,
                               extra_args=["--bridge", "context", "--debug", "--config", str(cfg)])


async def until(condition, what: str, bound: float = 20.0) -> None:
    async with asyncio.timeout(bound):
        while not condition():
            await asyncio.sleep(0.05)
    assert condition(), what


async def test_a_round_without_bridged_call_streams_the_upstreams_bytes(emulator, proxy_factory, tmp_path):
    proxy = await bridged_proxy(emulator, proxy_factory, tmp_path)
    upstream = openai_bytes(events(MSG))
    blocks = [b + b"\n\n" for b in upstream.split(b"\n\n") if b]
    sse = [("Content-Type", "text/event-stream; charset=utf-8")]
    emulator.script(Raw(headers=sse, body=blocks), Raw(headers=sse, body=[upstream]))
    body = {"model": "gpt-4.1", "input": "hi", "stream": True}
    async with aiohttp.ClientSession() as http:  # one connection: the second request reuses the loopback one
        for _ in range(2):
            async with http.post(proxy.url + "/v1/responses", json=body,
                                 headers={"Authorization": "Bearer sk-test-launch"}) as resp:
                assert resp.status == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                got = await resp.read()
            assert got == upstream  # byte for byte: nothing decoded and framed again
    reqs = emulator.responses_requests
    assert len(reqs) == 2
    for req in reqs:
        assert req.json["input"] == "hi" and "get_context_remaining" in req.tool_names
        assert req.header("authorization") == "Bearer sk-test-launch"  # the job's credentials, as cleared
    await until(lambda: proxy.log().count(TAKEN) >= 2, "the endpoint took both launched rounds")
    assert proxy.log().count(LAUNCHED) >= 2


async def test_the_sdk_streams_and_creates_through_a_launched_round(emulator, proxy_factory, tmp_path):
    proxy = await bridged_proxy(emulator, proxy_factory, tmp_path)
    emulator.script(Text("streamed", deltas=5), Text("held"))
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-launch", max_retries=0)
    async with client.responses.stream(model="gpt-4.1", input="one") as stream:
        seqs = [ev.sequence_number async for ev in stream]
        final = await stream.get_final_response()
    assert final.output_text == "streamed" and seqs == sorted(set(seqs))
    held = await client.responses.create(model="gpt-4.1", input="two", stream=False)
    assert held.output_text == "held"
    await client.close()
    await until(lambda: proxy.log().count(TAKEN) >= 2, "the endpoint took both launched rounds")


async def test_an_overflow_retry_reads_the_flows_body_and_is_bridged_too(emulator, proxy_factory, tmp_path):
    """The request to the endpoint went without its body; compaction's overflow recovery reads the flow's
    request afterwards and must find the body that was sent, then retries through the endpoint."""
    config = {"remote_compaction": {"enabled": True, "threshold": 1.0, "recover_overflow": True},
              "model_windows": {"gpt-test*": 20_000}}
    proxy = await bridged_proxy(emulator, proxy_factory, tmp_path, config)
    emulator.script(context_length_exceeded_400())
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-launch", max_retries=0)
    older = {"role": "user", "content": "an older history: " + "h" * 6_000}
    answer = await client.responses.create(model="gpt-test-1", input=[older, {"role": "user", "content": "q"}])
    await client.close()
    assert answer.output_text == "You said: q"
    turns = emulator.responses_requests  # the failed turn, the compaction's own, the retry
    first, retry = turns[0], turns[-1]
    assert first.status == 400 and retry.status == 200 and len(turns) >= 2
    assert retry.json["input"][-1] == {"role": "user", "content": "q"} and len(retry.raw_body) < len(first.raw_body)
    assert "get_context_remaining" in retry.tool_names  # the retry went through the bridge's endpoint
    assert proxy.log().count(LAUNCHED) >= 1


# ---- the endpoint alone --------------------------------------------------------------------------------


BODY = {"model": "gpt-4.1", "input": "direct", "stream": True}


async def service(emulator):
    turns = UpstreamTurns()
    svc = BridgeService(ToolClient("http://127.0.0.1:9", "unused"), lambda: turns)
    return svc, await svc.start(), turns


def job(emulator) -> BridgeJob:
    return BridgeJob(url=emulator.url + "/v1/responses", credentials=(), credentials_allowed=True,
                     offer=Offer((), {}, (), ()))


async def test_a_launched_round_whose_request_never_comes_is_closed(emulator, monkeypatch):
    monkeypatch.setattr(bridge_server, "CLAIM_SECONDS", 0.3)
    svc, _port, turns = await service(emulator)
    try:
        restored: list[bool] = []
        for reaped in (True, False):
            emulator.script(Text("never read", stall_before_headers=True))
            key, _path = svc.register(job(emulator), "/v1/responses")
            launched = svc.launch(key, [("Content-Type", "application/json")], orjson.dumps(BODY), BODY)
            assert launched is not None
            launched.take_body(lambda: restored.append(True))
            sent = 1 if reaped else 2
            await until(lambda n=sent: len(emulator.responses_requests) == n, "round 1 was sent")
            if not reaped:
                svc.drop_launched(key)  # the flow failed (the agent hung up) before its request came
            rec = emulator.responses_requests[-1]
            await until(lambda r=rec: r.client_disconnected, "the upstream saw round 1 closed")
            assert restored == [True] * (1 if reaped else 2)  # the flow got its body back
            assert svc.launch(key, [], orjson.dumps(BODY), BODY) is None  # launched once only
    finally:
        await svc.close()
        await turns.close()


async def test_the_endpoint_sends_what_it_receives_unless_it_is_the_launched_request(emulator):
    svc, port, turns = await service(emulator)
    try:
        async with aiohttp.ClientSession() as http:
            # A body-less request for a job whose round 1 is gone: a clear error, nothing sent.
            j = job(emulator)
            key, path = svc.register(j, "/v1/responses")
            j.body_taken = True
            async with http.post(f"http://127.0.0.1:{port}{path}", data=b"") as resp:
                assert resp.status == 504
                assert (await resp.json())["error"]["code"] == "bridge_round_expired"
            assert emulator.responses_requests == []
            # A request that is not the launched one (another length): it is sent as it came.
            emulator.set_default(lambda r: Text("received" if r.json["input"] == "the one that came" else "launched"))
            key, path = svc.register(job(emulator), "/v1/responses")
            assert svc.launch(key, [("Content-Type", "application/json")], orjson.dumps(BODY), BODY) is not None
            other = {**BODY, "input": "the one that came", "stream": False}
            async with http.post(f"http://127.0.0.1:{port}{path}", json=other) as resp:
                assert resp.status == 200
                answer = await resp.json()
            assert [i["content"][0]["text"] for i in answer["output"]] == ["received"]
            # (the launched request was closed, sent or not yet: the agent's answer is the received one's)
            assert emulator.responses_requests[-1].json["input"] == "the one that came"
    finally:
        await svc.close()
        await turns.close()
