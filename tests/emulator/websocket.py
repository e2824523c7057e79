"""The Responses WebSocket mode (`GET …/responses` with `Upgrade: websocket`), as the real API serves it.

Each client message is a JSON text frame `{"type": "response.create", …the create body…}`; the answer's
events are JSON text frames carrying the same objects as the SSE `data:` lines, in the same order. What the
emulator checks is what it checks on HTTP (the same `_check_create` / `_check_input`, the same scripts and
queues); a refused create is one `error` event (`{"type": "error", "status": …, "error": {…}}`) and the
connection stays open. Besides:
- `generate: false` is a warm-up: `response.created` + `response.completed` with no output, whose id the next
  create may chain from;
- the connection keeps its latest response, so `previous_response_id` naming it works even with
  `store: false` (its items are the chain's, as a stored response's are); a continuation that fails (an error
  event, or a response not completed) evicts the response it continued from;
- a connection lives `ws_connection_limit` seconds (60 minutes by default): then the error
  `websocket_connection_limit_reached` and a normal close;
- `ws_refuse = 426` (or any status) refuses the upgrade with that status and an error body, as an upstream
  without WebSocket mode does (Codex then falls back to HTTP);
- a message that is not a JSON object, or of an unknown type, gets an `invalid_request_error` event;
- lanes (`stream_id`): creates with the same `stream_id` (or none) run FIFO, creates on different lanes run at
  the same time, and every event of a lane's create (its error event too) echoes its `stream_id`; each lane keeps
  its latest response, and `previous_response_id` may name any lane's (a new lane forks from another's);
  `emu.before_answer` (an async callable given the ReceivedRequest) can hold one create while others go on.
- `response.interrupt {response_id, mode}` (Codex's, on its Responses-lite path) takes effect at once, not
  after the lane's running create: that response ends with `response.incomplete`,
  `incomplete_details.reason: "interrupted"` and `end_turn: false`, its output the items already done
  (`discard_partial_items`), and the socket goes on; a later create may chain from it. A stalled reply
  (`stall_after`) waits for it. Every message that is not a create is recorded in `ws_other_messages` in the
  order it arrived.
Every create is recorded like an HTTP one, with `transport == "ws"` and `ws_connection` (a counter).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import WSMsgType, web

from .cache import is_prewarm
from .recording import ReceivedRequest
from .render import Plan, error_plan, render
from .replies import Response
from .wire import ends_with_compaction_trigger, error_body

if TYPE_CHECKING:
    from .app import Emulator

WS_ONLY_FIELDS = ("generate", "stream_id")  # fields of the WebSocket create that CreateResponse does not list
TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})


STREAM_ID = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")


class WsConnection:
    """What one socket remembers: each lane's latest response (id, previous id, input, output), its lanes'
    queues and workers, and one lock for writing frames (lanes write at the same time)."""

    def __init__(self, number: int):
        self.number = number
        self.latest: dict[str | None, tuple[str, str | None, list[Any], list[Any]]] = {}
        self.lanes: dict[str | None, asyncio.Queue[str]] = {}
        self.workers: set[asyncio.Task[None]] = set()
        self.send_lock = asyncio.Lock()
        self.interrupts: set[str] = set()  # response ids a `response.interrupt` named
        self.wake = asyncio.Event()  # set at each interrupt (a stalled reply waits on it)

    def turns(self) -> dict[str, tuple[str | None, list[Any], list[Any]]]:
        return {rid: (prev, inp, out) for rid, prev, inp, out in self.latest.values()}


def lane_of(msg: Any) -> str | None:
    """The lane a client message names (`stream_id`), None for the default lane."""
    sid = msg.get("stream_id") if isinstance(msg, dict) else None
    return sid if isinstance(sid, str) else None


def with_lane(text: str, lane: str | None) -> str:
    """An event frame with its lane's `stream_id` added (as the real API echoes it)."""
    if lane is None or not text.endswith("}"):
        return text
    return text[:-1] + ',"stream_id":' + orjson.dumps(lane).decode() + "}"


def error_event(status: int, message: str, type_: str, param: str | None = None, code: str | None = None) -> str:
    return orjson.dumps({"type": "error", "status": status, **error_body(message, type_, param, code)}).decode()


async def serve(emu: Emulator, request: web.Request) -> web.StreamResponse:
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return await emu._other(request)
    if emu.ws_refuse is not None:
        rec, _ = await emu._record(request, "ws_upgrade")
        rec.transport = "ws"
        plan = error_plan(emu.ws_refuse, "WebSocket mode is not available here.", "invalid_request_error",
                          None, "websocket_not_supported")
        return await emu._send(request, rec, plan)
    ws = web.WebSocketResponse(max_msg_size=emu.ws_max_message, compress=True, autoping=True)
    await ws.prepare(request)
    emu.ws_connections += 1
    conn = WsConnection(emu.ws_connections)
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]
    emu.ws_upgrades.append(headers)
    limit = asyncio.get_running_loop().call_later(emu.ws_connection_limit, lambda: asyncio.ensure_future(
        _limit_reached(conn, ws)))
    try:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                _dispatch(emu, conn, request, headers, ws, msg.data)
            elif msg.type == WSMsgType.BINARY:
                emu.ws_binary.append(msg.data)
                await _send(conn, ws, error_event(400, "Binary frames are not supported; send JSON text frames.",
                                                  "invalid_request_error", None, "invalid_frame"))
    finally:
        limit.cancel()
        for task in list(conn.workers):
            task.cancel()
        for task in list(conn.workers):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        emu.ws_closed.append((conn.number, ws.close_code))
    return ws


def _dispatch(emu: Emulator, conn: WsConnection, request: web.Request, headers: list[tuple[str, str]],
              ws: web.WebSocketResponse, text: str) -> None:
    """Queue a client message on its lane (`stream_id`; the default lane for none, and for a message that is
    not an object); a lane with no worker gets one, which ends when its queue is empty."""
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        parsed = None
    lane = lane_of(parsed)
    if isinstance(parsed, dict) and parsed.get("type") != "response.create":
        emu.ws_other_messages.append(parsed)  # in the order they arrived, whatever runs meanwhile
        if parsed.get("type") == "response.interrupt":
            if isinstance(rid := parsed.get("response_id"), str):
                conn.interrupts.add(rid)
                conn.wake.set()
            return
    queue = conn.lanes.get(lane)
    if queue is not None:
        queue.put_nowait(text)
        return
    queue = conn.lanes[lane] = asyncio.Queue()
    queue.put_nowait(text)

    async def work() -> None:
        try:
            while not queue.empty():
                if not await _message(emu, conn, request, headers, ws, queue.get_nowait()):
                    return
        except (ConnectionError, RuntimeError):
            pass  # the socket is gone
        except Exception:
            await ws.close(code=1011)  # as a crashed handler would end it
            raise
        finally:
            if conn.lanes.get(lane) is queue:
                del conn.lanes[lane]

    task = asyncio.get_running_loop().create_task(work())
    conn.workers.add(task)
    task.add_done_callback(conn.workers.discard)


async def _send(conn: WsConnection, ws: web.WebSocketResponse, text: str) -> None:
    async with conn.send_lock:
        await ws.send_str(text)


async def _limit_reached(conn: WsConnection, ws: web.WebSocketResponse) -> None:
    if ws.closed:
        return
    await _send(conn, ws, error_event(400, "Responses websocket connection limit reached (60 minutes). Create a new "
                                       "websocket connection to continue.", "invalid_request_error", None,
                                      "websocket_connection_limit_reached"))
    await ws.close(code=1000, message=b"websocket_connection_limit_reached")


async def _message(emu: Emulator, conn: WsConnection, request: web.Request, headers: list[tuple[str, str]],
                   ws: web.WebSocketResponse, text: str) -> bool:
    """Answer one client message; False once the socket is to be left."""
    loop = asyncio.get_running_loop()
    data = text.encode()
    try:
        msg = orjson.loads(data)
    except orjson.JSONDecodeError:
        msg = None
    if not isinstance(msg, dict):
        await _send(conn, ws, error_event(400, "Invalid message: expected a JSON object.", "invalid_request_error",
                                          None, "invalid_json"))
        return True
    kind = msg.get("type")
    lane = lane_of(msg)
    if kind != "response.create":  # (recorded when it arrived)
        await _send(conn, ws, with_lane(error_event(400, f"Invalid value: {kind!r}. Supported values are: "
                                                         "'response.create'.", "invalid_request_error", "type",
                                                    "invalid_value"), lane))
        return True
    body = {k: v for k, v in msg.items() if k != "type"}
    rec = ReceivedRequest(method="WS", path=request.path, query=request.query_string, headers=headers,
                          raw_body=data, body=data, json=body, received_at=loop.time(), route="responses",
                          transport="ws", ws_connection=conn.number)
    if ends_with_compaction_trigger(body):  # Codex's remote compaction v2, as on HTTP
        rec.route = "compaction"
    emu._remember(rec)
    if "stream_id" in body and (lane is None or not STREAM_ID.match(lane)):
        return await _send_error(conn, ws, rec, error_plan(
            400, "Invalid 'stream_id': expected 1 to 256 letters, digits, '_', '.' or '-'.",
            "invalid_request_error", "stream_id", "invalid_value"), None)
    generate = body.get("generate", True) is not False
    checked = {k: v for k, v in body.items() if k not in WS_ONLY_FIELDS}
    local = conn.turns()
    error = emu._check_create(checked, local) or emu._check_input(checked, local) or emu._over_limit(rec)
    if error is not None:
        _evict(conn, body)
        return await _send_error(conn, ws, rec, error, lane)
    reply = Response([]) if not generate or is_prewarm(checked) else emu._next(rec.route, rec)
    if reply is None:
        from .app import compaction_reply, echo_reply

        reply = compaction_reply(rec) if rec.route == "compaction" else echo_reply(rec, emu.default_deltas)
    plan = render(reply, emu.cached_context(rec, {**checked, "stream": True}, local))
    plan.stall_after = getattr(reply, "stall_after", None)  # (as on HTTP: a reply that waits, e.g. for an interrupt)
    if emu.before_answer is not None:
        await emu.before_answer(rec)
    if plan.body is not None:  # an HttpError reply: the error event
        _evict(conn, body)
        return await _send_error(conn, ws, rec, plan, lane)
    if plan.response is not None:
        emu._remember_followers(plan.response.get("output") or [])
        emu.prompt_cache.produced(rec.extra["cache"].parts, plan.response.get("output") or [])
    rec.status, rec.response_id = 200, plan.response_id
    if plan.latency:
        await asyncio.sleep(plan.latency)
    ok = await _stream(conn, ws, rec, plan, lane)
    final = rec.extra.get("interrupted") or plan.response
    if final is not None and final.get("status") in ("completed", "incomplete"):
        if body.get("store") is not False:
            emu._store(rec, final)
        prev = body.get("previous_response_id")
        output = [i for i in final.get("output") or [] if isinstance(i, dict)]
        conn.latest[lane] = (final["id"], prev if isinstance(prev, str) else None,
                             emu._resolved_input(checked)[0], output)
    else:
        _evict(conn, body)
    rec.answered_at = loop.time()
    return ok


def _evict(conn: WsConnection, body: dict[str, Any]) -> None:
    """A failed continuation evicts the response it continued from (Open Responses 2026-04-24, "WebSocket
    transport"): a later create naming it is `previous_response_not_found` unless the response was stored."""
    prev = body.get("previous_response_id")
    for lane, (rid, *_rest) in list(conn.latest.items()):
        if rid == prev:
            del conn.latest[lane]


async def _send_error(conn: WsConnection, ws: web.WebSocketResponse, rec: ReceivedRequest, plan: Plan,
                      lane: str | None) -> bool:
    rec.status = plan.status
    err = orjson.loads(plan.body or b"{}")
    rec.extra["error_body"] = plan.body
    payload = err if isinstance(err, dict) and "error" in err else {"error": err}
    frame = orjson.dumps({"type": "error", "status": plan.status, **payload,
                          **({"stream_id": lane} if lane is not None else {})}).decode()
    rec.extra["frames"] = [frame]
    await _send(conn, ws, frame)
    return True


async def _stream(conn: WsConnection, ws: web.WebSocketResponse, rec: ReceivedRequest, plan: Plan,
                  lane: str | None) -> bool:
    """The plan's events as text frames; a planned disconnect drops the socket without a close frame."""
    chunks = plan.chunks or []
    limit = len(chunks) if plan.disconnect_after is None else min(plan.disconnect_after, len(chunks))
    if plan.stall_after is not None:
        limit = min(plan.stall_after, limit)
    loop = asyncio.get_running_loop()
    try:
        for index in range(limit):
            if rec.response_id in conn.interrupts:
                await _interrupted(conn, ws, rec, plan, lane)
                return True
            for text in _sse_data(chunks[index]):
                text = with_lane(text, lane)
                await _send(conn, ws, text)
                rec.extra.setdefault("frames", []).append(text)  # what the client should receive, as sent
            rec.events_sent += 1
            rec.write_times.append(loop.time())
            if delay := plan.delays.get(index):
                await asyncio.sleep(delay)
    except ConnectionError:
        rec.client_disconnected = True
        return False
    if plan.stall_after is not None:
        while not ws.closed:
            if rec.response_id in conn.interrupts:
                await _interrupted(conn, ws, rec, plan, lane)
                return True
            conn.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(conn.wake.wait(), 0.05)
        rec.client_disconnected = True
        return False
    if plan.disconnect_after is not None:
        transport = ws._req.transport if ws._req is not None else None  # type: ignore[attr-defined]
        if transport is not None:
            transport.close()  # no close frame: an upstream dying mid-turn
        return False
    return True


async def _interrupted(conn: WsConnection, ws: web.WebSocketResponse, rec: ReceivedRequest, plan: Plan,
                       lane: str | None) -> None:
    """The interrupted response's terminal event: the items already done, nothing partial (Responses lite)."""
    sent = [orjson.loads(t) for t in rec.extra.get("frames", [])]
    done = [e["item"] for e in sent if e.get("type") == "response.output_item.done"]
    seq = max((e.get("sequence_number", -1) for e in sent), default=-1) + 1
    response = {**(plan.response or {"id": rec.response_id, "object": "response"}), "status": "incomplete",
                "incomplete_details": {"reason": "interrupted"}, "end_turn": False, "output": done}
    rec.extra["interrupted"] = response
    text = with_lane(orjson.dumps({"type": "response.incomplete", "sequence_number": seq,
                                   "response": response}).decode(), lane)
    await _send(conn, ws, text)
    rec.extra.setdefault("frames", []).append(text)


def _sse_data(chunk: bytes) -> list[str]:
    """The `data:` payloads of an SSE chunk (one event or several), each one frame's text."""
    out: list[str] = []
    for block in chunk.split(b"\n\n"):
        lines = [ln[5:].lstrip(b" ") if ln.startswith(b"data:") else None for ln in block.split(b"\n")]
        data = [ln for ln in lines if ln is not None]
        if data:
            out.append(b"\n".join(data).decode())
    return out
