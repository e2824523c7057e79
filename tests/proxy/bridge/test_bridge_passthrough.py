"""The merger's pass-through of events it need not decode (proxy/bridge/merge.py `MergedStream.block`,
proxy/bridge/rawsse.py; issue 12: a request that needs no bridged call has no added latency).

Every stream here goes through the merger twice: as raw blocks (the fast path, what the endpoint runs) and
as decoded events (the path that reads everything); the bytes the agent gets and what the merger learnt
(ids, items, calls, usage, numbering) must be the same, however the upstream frames its events."""

from __future__ import annotations

import orjson
import pytest

from proxy.bridge.merge import MergedStream
from proxy.bridge.rawsse import EventSplitter
from proxy.items.sse import SSEDecoder

BRIDGED = frozenset({"get_context_remaining"})
MSG = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
       "content": [{"type": "output_text", "text": "hi there", "annotations": []}]}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_context_remaining", "arguments": ""}
AGENT_CALL = {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "shell", "arguments": ""}
USAGE = {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}


def events(*items: dict, seq0: int = 0) -> list[dict]:
    """A Responses stream: created, in_progress, each item's lifecycle, completed (`sequence_number` 0…)."""
    resp = {"id": "resp_1", "object": "response", "status": "in_progress", "output": [], "usage": None}
    out: list[dict] = [{"type": "response.created", "response": resp},
                       {"type": "response.in_progress", "response": resp}]
    for i, item in enumerate(items):
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out += [{"type": "response.output_item.added", "output_index": i, "item": {**item, "content": []}},
                    {"type": "response.content_part.added", "output_index": i, "item_id": item["id"],
                     "content_index": 0, "part": part}]
            out += [{"type": "response.output_text.delta", "output_index": i, "item_id": item["id"],
                     "content_index": 0, "delta": d, "logprobs": []} for d in ("hi", " there")]
            out += [{"type": "response.output_text.done", "output_index": i, "item_id": item["id"],
                     "content_index": 0, "text": "hi there", "logprobs": []},
                    {"type": "response.content_part.done", "output_index": i, "item_id": item["id"],
                     "content_index": 0, "part": {**part, "text": "hi there"}}]
        else:
            out += [{"type": "response.output_item.added", "output_index": i, "item": item},
                    {"type": "response.function_call_arguments.delta", "output_index": i, "item_id": item["id"],
                     "delta": "{}"},
                    {"type": "response.function_call_arguments.done", "output_index": i, "item_id": item["id"],
                     "arguments": "{}"}]
        done = {**item, "arguments": "{}", "status": "completed"} if item["type"] == "function_call" else item
        out.append({"type": "response.output_item.done", "output_index": i, "item": done})
    final = {**resp, "status": "completed", "usage": USAGE,
             "output": [{**i, "arguments": "{}", "status": "completed"} if i["type"] == "function_call" else i
                        for i in items]}
    out.append({"type": "response.completed", "response": final})
    return [{**e, "sequence_number": n + seq0} for n, e in enumerate(out)]


def openai_bytes(evs: list[dict]) -> bytes:
    """Framed as the API does: `event:` line, one `data:` line, blank line; `type` first."""
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in evs)


def chunked(raw: bytes, size: int) -> list[bytes]:
    return [raw[i:i + size] for i in range(0, len(raw), size)] or [b""]


def run(chunks: list[bytes], fast: bool) -> tuple[bytes, MergedStream]:
    """One round through the merger as the endpoint reads it (`turn._read_round`), then its final event."""
    m = MergedStream(BRIDGED)
    split, dec = EventSplitter(), SSEDecoder()
    out: list[bytes] = []
    for chunk in chunks:
        for raw in (split.feed(chunk) if fast else dec.feed(chunk)):
            out += m.block(raw) if fast else m.event(raw)
            if m.end is not None:
                break
        if m.end is not None:
            break
    if m.end is None:
        for ev in (split.close() if fast else dec.close()):
            out += m.event(ev)
    if m.end is not None and not m.end.calls:
        out.append(m.passthrough_final(m.end))
    return b"".join(out), m


def state(m: MergedStream) -> tuple:
    end = m.end
    return (m.seq, m.response_id, m.output(), m.usage, end and end.terminal, end and end.response,
            end and [(c.shown_index, c.item, c.done) for c in end.calls], end and end.agent_action)


STREAMS = {
    "text": openai_bytes(events(MSG)),
    "bridged call": openai_bytes(events(CALL)),
    "bridged call then text": openai_bytes(events(CALL, MSG)),
    "agent call": openai_bytes(events(AGENT_CALL)),
    "numbered from 1": openai_bytes(events(MSG, seq0=1)),
    "no sequence numbers": b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(
        {k: v for k, v in e.items() if k != "sequence_number"}) + b"\n\n" for e in events(MSG)),
    "crlf": openai_bytes(events(MSG)).replace(b"\n", b"\r\n"),
    "data lines only": b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events(MSG)),
    "comments, ids, no space": b": keep-alive\n\n" + b"".join(
        b"id: " + str(e["sequence_number"]).encode() + b"\nevent:" + e["type"].encode() + b"\ndata:"
        + orjson.dumps(e) + b"\n\n" for e in events(MSG)),
    "type not first": b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(
        {**{k: v for k, v in e.items() if k != "type"}, "type": e["type"]}) + b"\n\n" for e in events(MSG)),
    "pretty json": b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e).replace(b",", b", ")
                            .replace(b'":', b'": ') + b"\n\n" for e in events(MSG)),
    "extra blank lines": openai_bytes(events(MSG)).replace(b"\n\n", b"\n\n\n"),
    "text mentions sequence_number": openai_bytes(
        [{**e, "delta": '"sequence_number":99,'} if e["type"] == "response.output_text.delta" else e
         for e in events(MSG)]),
    "done sentinel": openai_bytes(events(MSG)) + b"data: [DONE]\n\n",
}


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_fast_path_sends_and_learns_what_decoding_would(name, size):
    chunks = chunked(STREAMS[name], size)
    fast, m_fast = run(chunks, fast=True)
    slow, m_slow = run(chunks, fast=False)
    assert fast == slow
    assert state(m_fast) == state(m_slow)


def test_a_round_without_bridged_call_passes_byte_for_byte():
    raw = STREAMS["text"]
    for size in (1, 13, len(raw)):
        out, m = run(chunked(raw, size), fast=True)
        assert out == raw
        assert m.response_id == "resp_1"


def test_the_bulk_of_a_plain_round_is_not_decoded(monkeypatch):
    """Only the events the merger reads are decoded: created/in_progress and deltas pass as bytes."""
    decoded: list[str] = []
    original = MergedStream.event

    def spy(self, ev):
        decoded.append(orjson.loads(ev.data)["type"])
        return original(self, ev)

    monkeypatch.setattr(MergedStream, "event", spy)
    run([STREAMS["text"]], fast=True)
    assert decoded == ["response.output_item.added", "response.output_item.done", "response.completed"]


def test_a_bridged_calls_events_are_rewritten_not_passed():
    out, m = run([STREAMS["bridged call then text"]], fast=True)
    assert m.end is not None and [c.item["call_id"] for c in m.end.calls] == ["call_1"]
    text = out.decode()
    assert "response.function_call_arguments" not in text and "response.mcp_call_arguments.done" in text
    assert '"type":"mcp_call"' in text
