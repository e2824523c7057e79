"""The upstream-turn service (proxy/upstream): one transport seam, one credential rule, hold or stream,
the next round of a turn. Tested over the in-memory transport (no sockets)."""

from __future__ import annotations

import orjson
import pytest

from proxy.upstream import MemoryTransport, UpstreamTurns, UpstreamUnavailable, continue_turn
from proxy.windows.remote.protocol import CompactionFailure
from proxy.windows.remote.remote import compaction_target, run_compaction

HEADERS = {"Authorization": "Bearer sk-x", "chatgpt-account-id": "acct", "Cookie": "c=1", "Host": "x",
           "Content-Length": "9", "x-other": "kept"}


def test_credentials_go_only_where_the_rule_cleared_them():
    cleared = UpstreamTurns.prepare("POST", "https://api.openai.com/v1/responses", HEADERS, b"{}", True)
    names = {k.lower() for k, _ in cleared.headers}
    assert {"authorization", "chatgpt-account-id", "x-other"} <= names
    assert not names & {"host", "content-length"}  # hop-by-hop: the transport sets its own
    refused = UpstreamTurns.prepare("POST", "https://gateway.example/v1/responses", HEADERS, b"{}", False)
    names = {k.lower() for k, _ in refused.headers}
    assert names == {"x-other"}  # no credential of any kind, cookies included


async def test_hold_reads_the_whole_answer_and_stream_gives_it_as_it_arrives():
    async def handler(req):
        headers = [("content-type", "text/event-stream"), ("connection", "keep-alive")]
        return 200, headers, [b"data: a\n\n", b"data: b\n\n"]

    transport = MemoryTransport(handler)
    turns = UpstreamTurns(transport)
    req = turns.prepare("POST", "http://up/v1/responses", {}, b'{"model":"m"}', False)
    held = await turns.hold(req)
    assert held.status == 200 and held.body == b"data: a\n\ndata: b\n\n"
    assert held.header("content-type") == "text/event-stream" and not held.header("connection")
    async with turns.stream(req) as answer:
        assert [c async for c in answer.chunks] == [b"data: a\n\n", b"data: b\n\n"]
    assert [r.body for r in transport.requests] == [b'{"model":"m"}'] * 2


async def test_an_unreachable_upstream_is_a_category_not_an_exception_of_the_transport():
    async def handler(req):
        raise UpstreamUnavailable("connection")

    turns = UpstreamTurns(MemoryTransport(handler))
    with pytest.raises(UpstreamUnavailable) as info:
        await turns.hold(turns.prepare("POST", "http://up/x", {}, b"", False))
    assert info.value.category == "connection"


async def test_compaction_calls_go_through_the_seam():
    """The compaction client uses the service: an in-memory /responses/compact answer is parsed."""
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque"}
    kept = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]}

    async def handler(req):
        assert req.url == "https://api.openai.com/v1/responses/compact"
        assert dict(req.headers)["authorization"] == "Bearer sk-x"
        return 200, [("content-type", "application/json")], [orjson.dumps(
            {"id": "resp_c", "object": "response.compaction", "output": [kept, item],
             "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}})]

    transport = MemoryTransport(handler)
    target = compaction_target("api", "https", "api.openai.com", 443, "/v1/responses",
                               {"authorization": "Bearer sk-x"}, True)
    result = await run_compaction(UpstreamTurns(transport), target, {"model": "gpt-5", "input": [kept]}, 30)
    assert result.compaction_item == item
    assert len(transport.requests) == 1

    async def down(req):
        raise UpstreamUnavailable("connection")

    with pytest.raises(CompactionFailure, match="connection"):
        await run_compaction(UpstreamTurns(MemoryTransport(down)), target, {"model": "gpt-5", "input": []}, 30)


def test_continue_turn_appends_the_round_and_keeps_unknown_fields():
    call = {"type": "function_call", "call_id": "c1", "name": "notes_read_file", "arguments": "{}"}
    out = {"type": "function_call_output", "call_id": "c1", "output": "text"}
    payload = {"model": "gpt-5", "input": "hi", "tools": [], "zz_unknown": {"a": 1}}
    nxt = continue_turn(payload, [call], [out])
    assert nxt["input"] == [{"role": "user", "content": "hi"}, call, out]
    assert nxt["zz_unknown"] == {"a": 1} and payload["input"] == "hi"  # the original is not changed
    stateful = continue_turn({**payload, "previous_response_id": "resp_0"}, [call], [out], response_id="resp_1")
    assert stateful["previous_response_id"] == "resp_1" and stateful["input"] == [out]
