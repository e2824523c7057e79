"""No flow outlives its exchange: after the chain has seen a flow end and the flow is dropped, garbage
collection frees it (issue 10.1: every streamed answer used to stay in memory for good)."""

from __future__ import annotations

import asyncio
import gc
import weakref

import orjson
import pytest
from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from addons import chain
from addons.chain_addon import ChainAddon
from proxy.items.sse import encode_event


def _flow(n: int, stream: bool) -> http.HTTPFlow:
    body = {"model": "gpt-5", "stream": stream, "input": [{"role": "user", "content": f"hello {n} " + "x" * 2000}]}
    req = tutils.treq(method=b"POST", scheme=b"https", host="api.openai.com", port=443, path=b"/v1/responses",
                      content=orjson.dumps(body), headers=((b"content-type", b"application/json"),
                                                           (b"authorization", b"Bearer sk-test")))
    flow = tflow.tflow(req=req)
    flow.response = None
    return flow


def _sse(rid: str) -> list[bytes]:
    resp = {"id": rid, "object": "response", "model": "gpt-5", "status": "in_progress", "output": []}
    item = {"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "hi", "annotations": []}]}
    done = {**resp, "status": "completed", "output": [item],
            "usage": {"input_tokens": 50, "output_tokens": 1, "total_tokens": 51}}
    return [encode_event({"type": "response.created", "sequence_number": 0, "response": resp}),
            encode_event({"type": "response.output_item.done", "sequence_number": 1, "output_index": 0,
                          "item": item}),
            encode_event({"type": "response.completed", "sequence_number": 2, "response": done})]


def _json(rid: str) -> bytes:
    item = {"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "hi", "annotations": []}]}
    return orjson.dumps({"id": rid, "object": "response", "model": "gpt-5", "status": "completed",
                         "output": [item], "usage": {"input_tokens": 50, "output_tokens": 1, "total_tokens": 51}})


async def _exchange(addon: ChainAddon, n: int, stream: bool) -> weakref.ref:
    flow = _flow(n, stream)
    for hook in ("requestheaders", "request"):
        if (pending := getattr(addon, hook)(flow)) is not None:
            await pending
    ctype = "text/event-stream" if stream else "application/json"
    flow.response = http.Response.make(200, b"", {"content-type": ctype})
    if (pending := addon.responseheaders(flow)) is not None:
        await pending
    if callable(flow.response.stream):
        for chunk in _sse(f"resp_{n}"):
            flow.response.stream(chunk)
        flow.response.stream(b"")
        flow.response.content = b""
    else:
        flow.response.content = _json(f"resp_{n}")
    if (pending := addon.response(flow)) is not None:
        await pending
    return weakref.ref(flow)


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
async def test_no_flow_is_alive_after_its_exchange(rt, stream):
    addon = ChainAddon(chain())
    with taddons.context(addon):
        refs = [await _exchange(addon, n, stream) for n in range(40)]
        for _ in range(3):  # the request log finishes a flow right after its response hook (call_soon)
            await asyncio.sleep(0)
        gc.collect()
        alive = sum(1 for r in refs if r() is not None)
        assert alive == 0, f"{alive} of {len(refs)} flows still alive after gc"

