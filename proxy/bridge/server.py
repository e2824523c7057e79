"""The loopback endpoint mitmproxy streams a bridged answer from (ADR 0007).

A mitmproxy stream callable is synchronous and cannot wait for a tool, so a request the bridge offered
tools to is re-routed by the bridge stage to this endpoint, inside the proxy process, on 127.0.0.1 and
a random port, under a one-time job id. The handler answers with the merged lifecycle as it is
produced; mitmproxy streams it to the agent as it would any upstream (so the tap and the journal see
what the agent sees). The job (destination, credentials, identity, offer) never leaves memory and is
dropped after a minute (it may be claimed again meanwhile: compaction's overflow retry re-sends the
flow's request here).

The first round does not wait for the loopback hop: the moment the request is final (the body writer
has written the body; failing that, when mitmproxy's request hook task ends) the stage hands it as
forwarded to `launch`, which sends it upstream at once; the request mitmproxy then writes to this
endpoint carries no body (`Launched.take_body`). The endpoint's first request of that length for the job
takes the launched round (`_claim`: the flow gets its body back), and that round's own task writes the
answer; any later request for the job (a retry), or one of another length, is sent as received. A
launched round nobody claims within CLAIM_SECONDS (the request never arrived) is closed, as is one whose
flow failed first (the agent hung up); the flow then gets its body back too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from proxy.bridge.merge import TURN_USAGE_HEADER, usage_header
from proxy.bridge.specs import DISPLACED
from proxy.bridge.turn import BridgedTurn, BridgeJob, TurnStats
from proxy.files import atomic_write_text
from proxy.host import loopback
from proxy.host.flowbody import decode_bounded, max_body_bytes
from proxy.host.loopback import JOB_TTL, Loopback, job_path, new_job
from proxy.items.bridged import BridgeMemory
from proxy.toolclient import BridgeTool, ToolClient, ToolServerUnreachable
from proxy.upstream import UpstreamBroken, UpstreamTurns, UpstreamUnavailable

log = logging.getLogger("ctproxy.bridge")

PATH_PREFIX = "/ctp-bridge/"


def agent_path(path: str) -> str:
    """The path the agent asked for, of a request the bridge stage re-routed (`/ctp-bridge/<key>/…`): what
    logs and the dashboard show. The key is a one-time secret of the job and never leaves the process."""
    return loopback.agent_path(path, PATH_PREFIX)
SEEN_FILE = "bridge-seen.json"  # in the state directory: what the running proxy's bridge saw

CLAIM_SECONDS = 30.0  # a launched first round whose request has not reached the endpoint by then is closed
# Not forwarded upstream: hop-by-hop, framing, and what the endpoint's own connection added.
DROP_REQUEST = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                          "accept-encoding", "proxy-connection", "te", "upgrade"})
DROP_RESPONSE = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding",
                           "date", "server"})


class _Response(web.StreamResponse):
    # The headers go out with the first bytes of the body: one write, and one wake-up of mitmproxy, fewer.
    _send_headers_immediately = False


@dataclass
class Launched:
    """A job's first round, sent upstream before its request reached the endpoint (`BridgeService.launch`):
    `task` serves the whole answer once the endpoint's request for it arrives (`sink`)."""

    task: asyncio.Task[web.StreamResponse]
    sink: asyncio.Future[web.Request]  # the endpoint's request to answer, set when it arrives
    # The body length of the request mitmproxy sends to the endpoint: the endpoint's first request for the
    # job must have it to take this round. 0 once the stage took the body off that request (`take_body`).
    forwarded: int
    restore: Callable[[], None] | None = field(default=None, repr=False)  # gives the flow its body back
    reaper: asyncio.TimerHandle | None = None

    def take_body(self, restore: Callable[[], None]) -> None:
        """The request to the endpoint carries no body (this round has it); `restore` puts it back on the flow
        once the endpoint has the request (later readers — the request log, compaction's retry — see it)."""
        self.forwarded, self.restore = 0, restore

    def give_back(self) -> None:
        restore, self.restore = self.restore, None
        if restore is not None:
            restore()

    def close(self) -> None:
        """Not claimed: stop the round (sending or open; its answer is closed) and give the flow its body."""
        if self.reaper is not None:
            self.reaper.cancel()
        self.give_back()
        self.task.cancel()


def _eager[T](coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task whose first step runs now (the request goes out in this call), not on the next loop turn."""
    loop = asyncio.get_running_loop()
    try:
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg]
    except TypeError:  # an interpreter without eager tasks
        return loop.create_task(coro)


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
    launched: int = 0  # first rounds sent before their request reached the endpoint (`launch`)
    _seen_due: bool = False
    _jobs: OrderedDict[str, tuple[float, BridgeJob]] = field(default_factory=OrderedDict)
    _launched: dict[str, Launched] = field(default_factory=dict)
    _claimed: set[str] = field(default_factory=set)  # jobs whose first request reached the endpoint
    _endpoint: Loopback = field(default_factory=Loopback)
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
        # The agent hanging up (mitmproxy closes the endpoint's connection) cancels the turn and its calls.
        self.port = await self._endpoint.start(self._app)
        return self.port

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=1024 * 1024 * 1024)
        app.router.add_post(PATH_PREFIX + "{job}/{rest:.*}", self._handle)
        return app

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

    def register(self, job: BridgeJob, path: str) -> tuple[str, str]:
        """(key, path): the job's key, and the path to re-route the agent's request to: the key, then the
        request's own path (so every stage still sees a Responses request: `…/v1/responses`)."""
        key = new_job(self._jobs, job, time.monotonic(), self._claimed.discard)
        return key, job_path(PATH_PREFIX, key, path)

    def launch(self, key: str, headers: Sequence[tuple[str, str]], body: bytes, payload: Any) -> Launched | None:
        """Send a job's first round upstream now: `headers` and `body` as mitmproxy forwards them to the
        endpoint, `payload` their parsed JSON (the stage's, already decoded). Called once the request is final
        (the body written, every stage run); None when the job is gone or its request already arrived or was
        launched (nothing sent)."""
        entry = self._jobs.get(key)
        if entry is None or key in self._claimed or entry[1].launched:
            return None
        entry[1].launched = True
        loop = asyncio.get_running_loop()
        sink: asyncio.Future[web.Request] = loop.create_future()
        task = _eager(self._serve(sink, entry[1], _forwarded(headers), body, payload))
        task.add_done_callback(_retrieved)
        launched = Launched(task, sink, len(body))
        launched.reaper = loop.call_later(CLAIM_SECONDS, self._unclaimed, key, launched)
        self._launched[key] = launched
        self.launched += 1
        return launched

    def drop_launched(self, key: str) -> None:
        """The agent went away before its request reached the endpoint: its launched round is closed."""
        launched = self._launched.pop(key, None)
        if launched is not None:
            launched.close()

    def _unclaimed(self, key: str, launched: Launched) -> None:
        if self._launched.get(key) is launched:
            del self._launched[key]
            log.warning("bridge: a launched round was not claimed within %.0f s and was closed", CLAIM_SECONDS)
            launched.close()

    def _claim(self, key: str, length: int | None) -> Launched | None:
        """The launched first round for the endpoint's first request of a job, if it is that request (its
        body is then given back to the flow)."""
        self._claimed.add(key)
        launched = self._launched.pop(key, None)
        if launched is None:
            return None
        if launched.reaper is not None:
            launched.reaper.cancel()
        if (length or 0) != launched.forwarded:  # not the request that was launched: it is sent as it came
            launched.close()
            return None
        launched.give_back()
        log.debug("bridge: the endpoint took its launched round 1")
        return launched

    async def close(self) -> None:
        for key in list(self._launched):
            self.drop_launched(key)
        await self._endpoint.close()
        await self.tools.close()

    def ran_calls(self, path: str) -> bool:
        """Whether the job a re-routed request path names (`/ctp-bridge/<key>/…`) has executed calls."""
        if not path.startswith(PATH_PREFIX):
            return False
        entry = self._jobs.get(path[len(PATH_PREFIX):].split("/", 1)[0])
        return entry is not None and entry[1].ran > 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        # Not popped: compaction's overflow retry re-sends the flow's request (to this endpoint) within the
        # job's minute, when no call ran yet; the key is unguessable and the endpoint listens on loopback only.
        key = request.match_info["job"]
        entry = self._jobs.get(key)
        if entry is None or entry[0] < time.monotonic() - JOB_TTL:
            return _json_error(404, "unknown_bridge_job", "no such bridged request (it expired)")
        job = entry[1]
        if job.ran:  # served again, the turn would run from round 1: its calls a second time
            return _json_error(409, "bridge_calls_ran", "this bridged request already ran tool calls; it is not "
                                    "sent again (its calls would run twice)")
        launched = self._claim(key, request.content_length)
        if launched is not None:  # its first round is on its way: the body that came here is not needed
            launched.sink.set_result(request)
            return await launched.task  # (cancelling this handler cancels the round)
        if job.body_taken and not request.content_length:  # its body went with that round, now closed
            return _json_error(504, "bridge_round_expired", "the bridged request's first round was closed before "
                                    "the request reached ctproxy's bridge endpoint")
        body = await request.read()
        try:
            encoding = request.headers.get("Content-Encoding", "")
            payload = orjson.loads(decode_bounded(body, encoding, max_body_bytes()) if encoding else body)
        except (orjson.JSONDecodeError, ValueError):  # undecodable: forwarded as it is, not bridged
            payload = None
        sink: asyncio.Future[web.Request] = asyncio.get_running_loop().create_future()
        sink.set_result(request)
        return await self._serve(sink, job, _forwarded(request.headers.items()), body, payload)

    async def _serve(self, sink: Awaitable[web.Request], job: BridgeJob, headers: list[tuple[str, str]],
                     body: bytes, payload: Any) -> web.StreamResponse:
        """Send the request upstream, then answer the endpoint's request (awaited from `sink` once the
        first round's headers are in) with the merged lifecycle, or the upstream's answer as it came."""
        usable = isinstance(payload, dict)
        turn = BridgedTurn(job, self.turns_of(), self.tools, self.memory, headers, body, payload if usable else {})
        streaming = usable and payload.get("stream") is True
        try:
            async with turn.turns.stream(turn.request(body, first=True), job.timeout) as answer:
                request = await sink
                ctype = answer.header("content-type").lower()
                usable = usable and answer.status == 200 and (
                    ctype.startswith("text/event-stream") if streaming else "json" in ctype)
                resp = _Response(status=answer.status, headers=_response_headers(answer.headers))
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
            cost = usage_header(turn.stats.usage, turn.stats.usage_rounds)
            return web.Response(status=status, body=out, content_type="application/json",
                                headers={TURN_USAGE_HEADER: cost} if cost is not None else None)
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


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A launched round that ended without its request (closed, or a fault before it came)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("bridge: a launched round failed: %s", type(exc).__name__, exc_info=exc)


def _forwarded(headers: Any) -> list[tuple[str, str]]:
    """The request's headers as the upstream gets them (credentials are the job's, added by the turn)."""
    out = [(k, v) for k, v in headers if k.lower() not in DROP_REQUEST]
    out.append(("Accept-Encoding", "identity"))  # the merger reads the events
    return out


def _response_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in DROP_RESPONSE]


def _json_error(status: int, code: str, message: str) -> web.Response:
    return web.Response(status=status, content_type="application/json",
                        body=orjson.dumps({"error": {"message": message, "type": "ctproxy_bridge", "code": code,
                                                     "param": None}}))
