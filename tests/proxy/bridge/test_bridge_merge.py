"""The merged lifecycle and the input repair as pure functions (proxy/bridge/merge.py, items.py; issue 12)."""

from __future__ import annotations

import orjson

from proxy.bridge.merge import MergedStream, merge_responses, sum_usage, usage_header
from proxy.items.bridged import BridgeMemory, ExecutedCall, mcp_id, repair_request
from proxy.items.sse import SSEDecoder, SSEEvent


def ev(typ: str, seq: int, **fields) -> SSEEvent:
    return SSEEvent(typ, orjson.dumps({"type": typ, "sequence_number": seq, **fields}).decode())


def decode(frames: list[bytes]) -> list[dict]:
    return [orjson.loads(e.data) for e in SSEDecoder().feed(b"".join(frames))]


CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_context_remaining", "arguments": ""}
DONE_CALL = {**CALL, "arguments": "{}", "status": "completed"}
MSG = {"type": "message", "id": "msg_2", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}


def test_two_rounds_one_lifecycle():
    ready = []
    m = MergedStream(frozenset({"get_context_remaining"}), on_call_ready=ready.append)
    resp1 = {"id": "resp_1", "output": [], "usage": {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}}
    out: list[bytes] = []
    for e in [ev("response.created", 0, response={"id": "resp_1"}),
              ev("response.in_progress", 1, response={"id": "resp_1"}),
              ev("response.output_item.added", 2, output_index=0, item=CALL),
              ev("response.function_call_arguments.delta", 3, output_index=0, item_id="fc_1", delta="{}"),
              ev("response.output_item.done", 4, output_index=0, item=DONE_CALL),
              ev("response.completed", 5, response={**resp1, "output": [DONE_CALL]})]:
        out += m.event(e)
    assert m.end is not None and m.end.calls and ready  # the call may start before the round ended
    out += m.call_finished(m.end.calls[0], "12 tokens left", None)
    m.next_round()
    resp2 = {"id": "resp_2", "output": [MSG], "usage": {"input_tokens": 20, "output_tokens": 3, "total_tokens": 23}}
    for e in [ev("response.created", 0, response={"id": "resp_2"}),
              ev("response.in_progress", 1, response={"id": "resp_2"}),
              ev("response.output_item.added", 2, output_index=0, item=MSG),
              ev("response.output_item.done", 3, output_index=0, item=MSG),
              ev("response.completed", 4, response=resp2)]:
        out += m.event(e)
    out.append(m.final(m.end))
    events = decode(out)
    types = [e["type"] for e in events]
    assert types.count("response.created") == 1 and types.count("response.completed") == 1
    assert "function_call" not in orjson.dumps(events).decode().replace("function_call_arguments", "")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [a["output_index"] for a in added] == [0, 1]
    final = events[-1]["response"]
    assert final["id"] == "resp_1"
    assert [o["type"] for o in final["output"]] == ["mcp_call", "message"]
    assert final["output"][0]["id"] == mcp_id("function", "call_1") and final["output"][0]["output"] == "12 tokens left"
    assert final["usage"] == {"input_tokens": 20, "output_tokens": 3, "total_tokens": 23}  # the last round's


def test_a_round_without_bridged_calls_passes_as_it_came():
    m = MergedStream(frozenset({"x"}))
    raw = [ev("response.created", 0, response={"id": "r"}),
           ev("response.output_item.added", 1, output_index=0, item=MSG)]
    frames = [f for e in raw for f in m.event(e)]
    assert frames == [b"event: " + e.event.encode() + b"\ndata: " + e.data.encode() + b"\n\n" for e in raw]


def test_usage_sum_and_merge():
    assert sum_usage({"input_tokens": 1, "input_tokens_details": {"cached_tokens": 1}},
                     {"input_tokens": 2, "input_tokens_details": {"cached_tokens": 3}}) == {
        "input_tokens": 3, "input_tokens_details": {"cached_tokens": 4}}
    rounds = [{"id": "a", "usage": {"output_tokens": 1}}, {"id": "b", "status": "completed",
                                                           "usage": {"output_tokens": 2}}]
    merged = merge_responses("a", rounds, [MSG])
    # the last round's usage: what the window holds (issue 29 (6)); the sum is the turn's cost, kept apart
    assert merged["id"] == "a" and merged["status"] == "completed" and merged["usage"]["output_tokens"] == 2
    assert usage_header({"input_tokens": 5, "output_tokens": 3, "total_tokens": 8,
                         "input_tokens_details": {"cached_tokens": 4}}, 2) == \
        "input_tokens=5, output_tokens=3, total_tokens=8, cached_tokens=4, rounds=2"
    assert usage_header(None, 2) is None


def test_repair_turns_resent_items_back_and_maps_the_id():
    memory = BridgeMemory()
    out = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}
    memory.remember_call(ExecutedCall(DONE_CALL, out, after_id="rs_1"))
    memory.remember_turn("resp_1", "resp_2", [])
    shown = {"type": "mcp_call", "id": mcp_id("function", "call_1"), "server_label": "ctproxy",
             "name": "get_context_remaining", "arguments": "{}", "output": "ok"}
    reasoning = {"type": "reasoning", "id": "rs_1", "encrypted_content": "x", "summary": []}
    resent = repair_request({"input": [reasoning, shown]}, memory)["input"]
    assert [i["type"] for i in resent] == ["reasoning", "function_call", "function_call_output"]
    assert "id" not in resent[1]
    dropped = repair_request({"input": [reasoning, MSG]}, memory)["input"]
    assert [i["type"] for i in dropped] == ["reasoning", "function_call", "function_call_output", "message"]
    chained = repair_request({"previous_response_id": "resp_1", "input": "next"}, memory)
    assert chained["previous_response_id"] == "resp_2"
    untouched = {"input": [MSG]}
    assert repair_request(untouched, memory) is untouched
    fresh = BridgeMemory()  # after a restart: the resent item rebuilds itself
    rebuilt = repair_request({"input": [shown]}, fresh)["input"]
    assert rebuilt == [{"type": "function_call", "call_id": "call_1", "name": "get_context_remaining",
                        "arguments": "{}"}, out]
