"""Overflow recovery, run by the window service (moved out of addons/compaction.py, issue 29): `recover`
compacts (at most once per agent request) and sends the one retry, held whole (the agent has seen nothing
yet). It reads the request and its per-request state (`RequestState`: the window decision it derives, compaction's
record) as plain values, never mitmproxy's flow: the stage that owns the flow (addons/compaction.py) puts the
retry's answer on it and refills the flow's tap from it (`proxy/host/flowstate.retap`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
from mitmproxy import http

from proxy import debuglog
from proxy.items.inputs import input_items
from proxy.upstream import UpstreamBroken, UpstreamUnavailable
from proxy.windows import compacting, service, sizing
from proxy.windows.host import WindowHost
from proxy.windows.remote.flowinfo import FlowInfo
from proxy.windows.remote.overflow import CODE, response_error_code
from proxy.windows.request import RequestState
from proxy.windows.service import WindowDeps


async def send_retry(deps: WindowDeps, request: http.Request, payload: dict[str, Any]) -> http.Response | None:
    """The retry of `request` with `payload`, through the upstream-turn service under the one credential rule."""
    req = request.copy()
    req.content = orjson.dumps(payload)  # re-encoded with the request's own Content-Encoding
    up = deps.turns.prepare(req.method, req.url, req.headers.items(multi=True), req.raw_content or b"",
                            deps.credentials_allowed)
    try:
        held = await deps.turns.hold(up)
    except (UpstreamUnavailable, UpstreamBroken):
        return None
    resp = http.Response.make(held.status, b"", [(k.encode(), v.encode()) for k, v in held.headers])
    resp.raw_content = held.body
    resp.headers["content-length"] = str(len(held.body))
    return resp


async def _plan(rt: WindowHost, st: RequestState, info: FlowInfo, forwarded: dict[str, Any],
                failed: dict[str, Any], failed_bytes: int, added: Sequence[Any] = ()
                ) -> tuple[Any, dict[str, Any], int] | None:
    """(checkpoint, retry payload, its bytes) for a request that overflowed: `forwarded` is the agent's request
    as it went upstream (what compacts), `failed` the body that failed (`forwarded` itself, or a later round
    of a bridged turn), `added` what that round added after the agent's items (executed calls and their
    outputs, carried whole). None: nothing smaller to send."""
    compacting.learn(rt, info, sizing.tokens(failed_bytes, info.estimate.ratio))
    decided = st.window
    if decided is not None:  # the request's current decision: a later stage (context) may have compacted
        info.checkpoint, info.replay_opaque = decided.checkpoint, decided.replay_opaque
        info.outcome = decided.outcome
        info.compacted, info.compacted_items = decided.compacted, decided.compacted_items
    replay = info.replay_opaque
    if not info.compacted and sizing.fresh(info):
        cp = await compacting.compact(rt, info, forwarded, "overflow")
        replay = cp.strategy == "remote"
        info.outcome = cp.strategy  # the retry below is a projection of this new checkpoint
    elif info.checkpoint is not None:
        cp = info.checkpoint  # no second compaction: the checkpoint in effect is made to fit instead
    else:
        compacting.event(rt, info, "recovery", "skipped", "no_new_items", None)
        return None
    retry_payload = dict(failed)
    retry_payload["input"] = [*cp.record().bootstrap(replay), *info.client_items[cp.boundary:], *added]
    info.checkpoint, info.replay_opaque = cp, replay
    st.window = sizing.decided(info, True)  # derived: the retry goes out with this checkpoint
    budget = failed_bytes * sizing.RETRY_FRACTION
    if sizing.payload_bytes(retry_payload, retry_payload["input"]) > budget:
        fitted = sizing.fit(retry_payload, info, sizing.tokens(int(budget), info.estimate.ratio), added)
        if fitted is None:
            compacting.event(rt, info, "recovery", "not_smaller", cp.strategy, cp.id)
            return None  # nothing smaller to send: the agent gets the original error
        retry_payload = fitted[0]
    return cp, retry_payload, sizing.payload_bytes(retry_payload, retry_payload["input"])


def _forwarded_record(rt: WindowHost, info: FlowInfo, cp_id: str, retry_bytes: int) -> None:
    """What the upstream really answered is the retry: the next estimate calibrates against it."""
    key, n = info.session_key, len(info.client_items)
    service.session_memo(rt).forget(key)
    compacting.write(rt, lambda rec: rec.record_forwarded(key, cp_id, n, retry_bytes), latest=("forwarded", key))


async def recover(rt: WindowHost, request: http.Request, st: RequestState, info: FlowInfo) -> http.Response | None:
    """Compact (at most once per agent request, and only with new agent items since the last
    compaction) and retry once with a body strictly smaller than the one that failed: at most
    sizing.RETRY_FRACTION of it, the bootstrap giving way until it fits. The failed size is also an upper
    bound of the upstream's real window: it is learned and remembered. The retry's answer, or None: the agent
    gets the original upstream error unchanged."""
    started = time.perf_counter()
    try:
        forwarded = orjson.loads(request.get_content(strict=False) or b"")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(forwarded, dict):
        return None
    failed_bytes = sizing.payload_bytes(forwarded, input_items(forwarded) or [])
    planned = await _plan(rt, st, info, forwarded, forwarded, failed_bytes)
    if planned is None:
        return None
    cp, retry_payload, retry_bytes = planned
    deps = service.deps_of(rt, info.route, info.credentials_allowed, st.journal)
    new = await send_retry(deps, request, retry_payload)
    code = None if new is None else response_error_code(
        new.status_code, new.headers.get("content-type", ""), new.get_content(strict=False) or b"")
    ok = new is not None and code is None
    if code == CODE:
        compacting.learn(rt, info, sizing.tokens(retry_bytes, info.estimate.ratio))
    outcome = "recovered" if ok else "retry_failed"
    compacting.event(rt, info, "recovery", outcome, cp.strategy, cp.id)
    debuglog.event("overflow_recovery", outcome=outcome, strategy=cp.strategy, host=request.host,
                   status=new.status_code if new is not None else None, bytes=retry_bytes,
                   ms=(time.perf_counter() - started) * 1000)
    if not ok or new is None:
        return None  # the agent gets the original upstream error unchanged
    _forwarded_record(rt, info, cp.id, retry_bytes)
    return new


def midturn_recovery(rt: WindowHost, st: RequestState, host: str
                     ) -> Callable[[dict[str, Any], dict[str, Any]], Awaitable[dict[str, Any] | None]] | None:
    """The bridge's hook for a later round of a bridged turn that overflowed after calls ran (BridgeJob.overflow):
    the round again, the agent's history compacted and the turn's executed calls with their outputs carried
    whole, so nothing runs twice and the turn goes on from the round that failed. None when overflow recovery
    is off for this request."""
    if not rt.config.recovers_overflow():
        return None

    async def hook(first: dict[str, Any], failed: dict[str, Any]) -> dict[str, Any] | None:
        info = st.compaction
        if not isinstance(info, FlowInfo) or not info.route.eligible or failed.get("previous_response_id"):
            return None
        first_items, failed_items = input_items(first) or [], input_items(failed) or []
        if failed_items[:len(first_items)] != first_items:
            return None  # not a continuation of the agent's request (a mid-turn rollover moved it)
        planned = await _plan(rt, st, info, first, failed, sizing.payload_bytes(failed, failed_items),
                              failed_items[len(first_items):])
        if planned is None:
            return None
        cp, retry_payload, retry_bytes = planned
        compacting.event(rt, info, "recovery", "midturn", cp.strategy, cp.id)
        debuglog.event("overflow_recovery", outcome="midturn", strategy=cp.strategy, host=host,
                       bytes=retry_bytes)
        _forwarded_record(rt, info, cp.id, retry_bytes)
        return retry_payload

    return hook


def ran_bridged_calls(rt: WindowHost, path: str) -> bool:
    """Whether the request at `path` is a bridged request whose turn already ran calls: it is never sent again (the
    bridge would run the whole turn again, side effects included; seed §5.3, §8)."""
    bridge = rt.services.bridge
    return bridge is not None and bridge.ran_calls(path)


def missed(rt: WindowHost, info: FlowInfo, reason: str = "streamed") -> None:
    """An overflow that streamed (output may have reached the agent), or a bridged turn's whose calls ran: too
    late to recover; the session's next request compacts instead."""
    key = info.session_key
    service.session_memo(rt).forget(key)
    compacting.write(rt, lambda rec: rec.mark_force_compact(key))
    compacting.event(rt, info, "recovery", "missed", reason, None)
