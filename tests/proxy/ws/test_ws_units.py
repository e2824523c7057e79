"""Pure parts of the WebSocket adapter (issue 28): the event framing both ways, the create frame a body
becomes, and the relay flow that keeps only the message in flight."""

from __future__ import annotations

import orjson
from mitmproxy.test import tflow
from mitmproxy.websocket import WebSocketMessage
from wsproto.frame_protocol import Opcode

from addons.websocket import WebSocket
from proxy.upstream.ws import event_type, sse_frame
from proxy.ws.server import PATH_PREFIX, _Sse


def test_event_frames_survive_sse_and_back_byte_for_byte() -> None:
    frames = ['{"type":"response.output_text.delta","delta":"a\\nb","sequence_number":3}',
              '{\n  "type": "response.created",\n  "x": 1\n}', '{"z":1,"type":"later.first"}']
    stream = b"".join(sse_frame(event_type(f), f) for f in frames)
    parser = _Sse()
    got = [ev for i in range(0, len(stream), 7) for ev in parser.feed(stream[i:i + 7])]
    assert got == frames
    assert [event_type(f) for f in frames] == ["response.output_text.delta", "response.created", "later.first"]
    assert event_type("not json") == ""


def test_an_unchanged_body_goes_as_the_clients_own_frame_and_a_changed_one_without_the_chains_stream() -> None:
    from proxy.upstream.ws import UpstreamSocket

    sock = UpstreamSocket(ws=None, http=None)  # type: ignore[arg-type]
    text = '{"type":"response.create", "model":"gpt-5","input":"hi"}'
    body = orjson.dumps({"model": "gpt-5", "input": "hi", "stream": True})
    lane = sock.begin(None, body, text, False)
    assert sock.message_for(body) == (None, text)
    _, changed_text = sock.message_for(orjson.dumps({"model": "gpt-5", "input": "hi", "stream": True,
                                                     "tools": [{"type": "web_search"}]}))
    changed = orjson.loads(changed_text)
    assert next(iter(changed)) == "type" and changed["type"] == "response.create" and "stream" not in changed
    lane.client_stream = True  # the client sent a `stream` field itself: it stays
    assert "stream" in orjson.loads(sock.message_for(orjson.dumps({"model": "m", "stream": True, "x": 1}))[1])
    # A lane's create: the frame keeps its `stream_id`, and the lane is known by it (a bridged round's body,
    # changed by the chain, still names it).
    sock.begin("agent_1", b"{}", "{}", False)
    assert sock.message_for(orjson.dumps({"model": "m", "stream_id": "agent_1", "stream": True}))[0] == "agent_1"
    sock.end(lane)
    assert None not in sock.lanes and "agent_1" in sock.lanes, "a lane no create uses is forgotten"


def test_events_go_to_the_lane_they_name() -> None:
    from proxy.upstream.ws import UpstreamSocket, stream_id_of

    assert stream_id_of('{"type":"response.created","stream_id":"b"}') == "b"
    assert stream_id_of('{"type":"response.output_text.delta","delta":"\\"stream_id\\""}') is None
    sock = UpstreamSocket(ws=None, http=None)  # type: ignore[arg-type]
    a, b = sock.begin("a", b"1", "1", False), sock.begin("b", b"2", "2", False)
    assert sock._sink_for('{"type":"x","stream_id":"a"}') is None, "no turn of lane a is reading"
    import asyncio

    a.sink, b.sink = asyncio.Queue(), asyncio.Queue()
    assert sock._sink_for('{"type":"x","stream_id":"a"}') is a
    assert sock._sink_for('{"type":"x","stream_id":"b"}') is b
    assert sock._sink_for('{"type":"x"}') is None, "two lanes reading: an event naming none is nobody's"
    a.sink = None
    assert sock._sink_for('{"type":"x"}') is b, "one lane reading: an upstream that does not echo lanes"


def test_the_relay_flow_keeps_only_the_message_in_flight() -> None:
    flow = tflow.twebsocketflow()
    flow.request.path = PATH_PREFIX + "key/v1/responses"
    flow.websocket.messages = [WebSocketMessage(Opcode.TEXT, True, b"x" * 1000) for _ in range(5)]
    last = flow.websocket.messages[-1]
    WebSocket().websocket_message(flow)
    assert flow.websocket.messages == [last]
    other = tflow.twebsocketflow()  # a socket ctproxy does not terminate keeps mitmproxy's record
    n = len(other.websocket.messages)
    WebSocket().websocket_message(other)
    assert len(other.websocket.messages) == n


def test_the_raw_relay_to_the_adapter_keeps_only_the_chunk_in_flight() -> None:
    from mitmproxy.tcp import TCPMessage

    stage = WebSocket()
    from proxy.ws import WsService

    stage._svc = WsService(lambda: None, port=4321)
    flow = tflow.ttcpflow()
    flow.server_conn.address = ("127.0.0.1", 4321)
    flow.messages = [TCPMessage(True, b"x" * 100) for _ in range(4)]
    last = flow.messages[-1]
    stage.tcp_message(flow)
    assert flow.messages == [last]
    other = tflow.ttcpflow()  # another TCP relay keeps mitmproxy's record
    n = len(other.messages)
    stage.tcp_message(other)
    assert len(other.messages) == n


def test_only_streamed_creates_of_a_connection_go_over_its_socket() -> None:
    """A `POST …/responses` carrying a connection key goes over the socket — the client's own create, a bridged
    round, an overflow retry, all streamed — except ctproxy's own held turn (`"stream": false`, the checkpoint
    turn), which goes over HTTP with the key taken off (the socket's latest response stays the client's)."""
    from proxy.upstream import UpstreamTurns
    from proxy.upstream.ws import SOCKET_TRANSPORT, WS_HEADER, UpstreamSocket, register, unregister

    sock = UpstreamSocket(ws=None, http=None)  # type: ignore[arg-type]
    register("k1", sock)
    try:
        turns = UpstreamTurns(transport=object())  # type: ignore[arg-type]
        headers = [("content-type", "application/json"), (WS_HEADER, "k1")]

        def routed(body: dict) -> tuple[object, list[str]]:
            req = turns.prepare("POST", "http://up.test/v1/responses", headers, orjson.dumps(body), False)
            req, transport = turns.route(req)
            return transport, [k for k, _ in req.headers]

        for streamed in ({"model": "m", "input": "hi", "stream": True}, {"model": "m", "input": "hi"}):
            transport, names = routed(streamed)
            assert transport is SOCKET_TRANSPORT and WS_HEADER in names
        transport, names = routed({"model": "m", "input": "checkpoint", "stream": False})
        assert transport is turns.transport and WS_HEADER not in names
        # …and without the WebSocket create's own envelope (a lane's `stream_id`), which HTTP does not take.
        req = turns.prepare("POST", "http://up.test/v1/responses", headers, orjson.dumps(
            {"model": "m", "stream_id": "lane_1", "input": "checkpoint", "stream": False}), False)
        req, transport = turns.route(req)
        assert transport is turns.transport and orjson.loads(req.body) == {"model": "m", "input": "checkpoint",
                                                                           "stream": False}
        assert sock.message_for(orjson.dumps({"model": "m", "input": "hi", "stream": True}))[1] == \
            '{"type":"response.create","model":"m","input":"hi"}'
    finally:
        unregister("k1")
