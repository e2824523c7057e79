"""The loopback endpoint mitmproxy streams a bridged answer from (ADR 0007).

A mitmproxy stream callable is synchronous and cannot wait for a tool, so a request the bridge offered
tools to is re-routed by the bridge stage to this endpoint, inside the proxy process, on 127.0.0.1 and
a random port, under a one-time job id. The handler sends the request upstream through the
upstream-turn service and answers with the merged lifecycle as it is produced; mitmproxy streams it to
the agent as it would any upstream (so the tap and the journal see what the agent sees). The job
(destination, credentials, identity, offer) never leaves memory and is dropped after a minute (it may be
claimed again meanwhile: compaction's overflow retry re-sends the flow's request here).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiohttp import web

from proxy.bridge.items import BridgeMemory
from proxy.bridge.specs import DISPLACED
from proxy.bridge.turn import BridgedTurn, BridgeJob, TurnStats
from proxy.files import atomic_write_text
from proxy.flowbody import decode_bounded, max_body_bytes
from proxy.toolclient import BridgeTool, ToolClient, ToolServerUnreachable
from proxy.upstream import UpstreamBroken, UpstreamTurns, UpstreamUnavailable

log = logging.getLogger("ctproxy.bridge")

PATH_PREFIX = "/ctp-bridge/"
SEEN_FILE = "bridge-seen.json"  # in the state directory: what the running proxy's bridge saw

JOB_TTL = 60.0
MAX_JOBS = 10_000
# Not forwarded upstream: hop-by-hop, framing, and what the endpoint's own connection added.
DROP_REQUEST = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                          "accept-encoding", "proxy-connection", "te", "upgrade"})
DROP_RESPONSE = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding",
                           "date", "server"})


@dataclass
class BridgeService:
    """The proxy's bridge: its endpoint, its tool-server client, what it remembers (Services.bridge)."""

    tools: ToolClient
    turns_of: Callable[[], UpstreamTurns]
    memory: BridgeMemory = field(default_factory=BridgeMemory)
    specs: list[BridgeTool] | None = None  # the registry as the tool server serves it (fetched once)
    specs_error: str = ""
    port: int = 0
    stats: TurnStats = field(default_factory=TurnStats)  # totals of this process: rounds, bridged calls
    seen_path: Path | None = None  # where `ctproxy status` reads what this process saw (SEEN_FILE)
    displaced: dict[str, int] = field(default_factory=dict)  # bridged tool -> requests whose agent had its own
    _seen_due: bool = False
    _jobs: OrderedDict[str, tuple[float, BridgeJob]] = field(default_factory=OrderedDict)
    _runner: web.AppRunner | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def tool_specs(self) -> list[BridgeTool] | None:
        if self.specs is None:
            async with self._lock:
                if self.specs is None:
                    try:
                        self.specs = await self.tools.specs()
                        self.specs_error = ""
                    except ToolServerUnreachable as exc:
                        self.specs_error = f"the tool server did not answer ({exc})"
                        return None
        return self.specs

    async def carried(self, specs: list[BridgeTool], session: str | None, task: str | None, agent: str | None,
                      deferred: list[str]) -> frozenset[str] | None:
        """Tool discovery's names for this caller; the tool server not answering holds back every
        deferred tool (no load is known)."""
        try:
            return await self.tools.carried(session, task, agent)
        except ToolServerUnreachable:
            held = frozenset(deferred)
            return frozenset(t.name for t in specs if t.name not in held)

    async def start(self) -> int:
        if self._runner is None:
            async with self._lock:
                if self._runner is None:
                    app = web.Application(client_max_size=1024 * 1024 * 1024)
                    app.router.add_post(PATH_PREFIX + "{job}/{rest:.*}", self._handle)
                    # The agent hanging up (mitmproxy closes this connection) cancels the turn and its calls.
                    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
                    await runner.setup()
                    site = web.TCPSite(runner, "127.0.0.1", 0)
                    await site.start()
                    self.port = runner.addresses[0][1]
                    self._runner = runner
        return self.port

    def note_left_out(self, left_out: tuple[tuple[str, str], ...]) -> None:
        """Count the bridged tools an agent's own tool displaced; `ctproxy status` shows them (written at
        most once a second, off the request path)."""
        hit = False
        for name, why in left_out:
            if why == DISPLACED:
                self.displaced[name] = self.displaced.get(name, 0) + 1
                hit = True
        if hit and self.seen_path is not None and not self._seen_due:
            self._seen_due = True
            asyncio.get_running_loop().call_later(1.0, self._write_seen)

    def _write_seen(self) -> None:
        self._seen_due = False
        data = orjson.dumps({"pid": os.getpid(), "displaced": self.displaced}).decode()
        path = self.seen_path
        if path is not None:
            asyncio.get_running_loop().run_in_executor(None, _write_quietly, path, data)

    def register(self, job: BridgeJob, path: str) -> str:
        """The path to re-route the agent's request to: the job's key, then the request's own path (so
        every stage still sees a Responses request: `…/v1/responses`)."""
        now = time.monotonic()
        while self._jobs and (next(iter(self._jobs.values()))[0] < now - JOB_TTL or len(self._jobs) > MAX_JOBS):
            self._jobs.popitem(last=False)
        key = secrets.token_urlsafe(18)
        self._jobs[key] = (now, job)
        return PATH_PREFIX + key + (path if path.startswith("/") else "/" + path)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.tools.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        # Not popped: compaction's overflow retry re-sends the flow's request (to this endpoint) within the
        # job's minute; the key is unguessable and the endpoint listens on loopback only.
        entry = self._jobs.get(request.match_info["job"])
        if entry is None or entry[0] < time.monotonic() - JOB_TTL:
            return _json_error(404, "unknown_bridge_job", "no such bridged request (it expired)")
        job = entry[1]
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in DROP_REQUEST]
        headers.append(("Accept-Encoding", "identity"))  # the merger reads the events
        try:
            encoding = request.headers.get("Content-Encoding", "")
            payload = orjson.loads(decode_bounded(body, encoding, max_body_bytes()) if encoding else body)
        except (orjson.JSONDecodeError, ValueError):  # undecodable: forwarded as it is, not bridged
            payload = None
        turn = BridgedTurn(job, self.turns_of(), self.tools, self.memory, headers, body,
                           payload if isinstance(payload, dict) else {})
        streaming = isinstance(payload, dict) and payload.get("stream") is True
        try:
            async with turn.turns.stream(turn.request(body, first=True), job.timeout) as answer:
                ctype = answer.header("content-type").lower()
                usable = answer.status == 200 and isinstance(payload, dict) and (
                    ctype.startswith("text/event-stream") if streaming else "json" in ctype)
                resp = web.StreamResponse(status=answer.status, headers=_response_headers(answer.headers))
                if not usable:  # an error, or nothing the bridge reads: as it came
                    await resp.prepare(request)
                    async for chunk in answer.chunks:
                        await resp.write(chunk)
                    await resp.write_eof()
                    return resp
                if streaming:
                    await resp.prepare(request)
                    async for out in turn.stream(answer):
                        await resp.write(out)
                    await resp.write_eof()
                    return resp
                first = b"".join([c async for c in answer.chunks])
            status, out = await turn.hold(first)
            return web.Response(status=status, body=out, content_type="application/json")
        except UpstreamUnavailable as exc:
            code = 504 if exc.category == "timeout" else 502
            return _json_error(code, "upstream_unavailable", f"the upstream could not be reached ({exc.category})")
        except UpstreamBroken:
            return _json_error(502, "upstream_broken", "the upstream's answer broke off")
        except (ConnectionResetError, asyncio.CancelledError):
            log.info("bridge: the agent hung up; the turn was stopped after %d round(s)", turn.stats.rounds)
            raise
        finally:
            self.stats.rounds += turn.stats.rounds
            self.stats.bridged_calls += turn.stats.bridged_calls


def _write_quietly(path: Path, text: str) -> None:
    try:
        atomic_write_text(path, text + "\n", mode=0o600)
    except OSError as exc:
        log.warning("bridge: %s not written (%s)", path.name, type(exc).__name__)


def _response_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in DROP_RESPONSE]


def _json_error(status: int, code: str, message: str) -> web.Response:
    return web.Response(status=status, content_type="application/json",
                        body=orjson.dumps({"error": {"message": message, "type": "ctproxy_bridge", "code": code,
                                                     "param": None}}))
