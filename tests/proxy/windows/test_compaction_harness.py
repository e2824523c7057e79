"""A running proxy (the real launcher, the full chain with the pipeline addons) in front of the emulator,
for the pipeline's end-to-end tests (test_compaction_e2e, test_overflow, test_debuglog). It holds no tests
itself; the name keeps it inside the pipeline's test files."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson

import addons
from proxy.app.launcher import UpOptions, run_up
from proxy.items.sse import SSEDecoder

ACCOUNT = "acct_pipeline_e2e"
JWT_SECRET_PART = "c2lnbmF0dXJlLXNob3VsZC1uZXZlci1iZS1sb2dnZWQ"
API_KEY = "sk-pipeline-e2e-SECRET-0123456789"


def codex_token() -> str:
    claims = base64.urlsafe_b64encode(orjson.dumps({"sub": "user-1"})).rstrip(b"=").decode()
    return f"eyJhbGciOiJSUzI1NiJ9.{claims}.{JWT_SECRET_PART}"


def pipeline_chain() -> list[Any]:
    """The lead's chain with history, compaction and web_search at their places (DESIGN §3.1)."""
    from addons.compaction import Compaction
    from addons.guard import Guard
    from addons.history import History
    from addons.tap import Tap
    from addons.web_search import WebSearch

    chain = [a for a in _original_chain() if type(a).__name__ not in ("History", "Compaction", "WebSearch")]
    tap_at = next(i for i, a in enumerate(chain) if isinstance(a, Tap))
    chain[tap_at + 1:tap_at + 1] = [History(), Compaction()]
    guard_at = next(i for i, a in enumerate(chain) if isinstance(a, Guard))
    chain.insert(guard_at, WebSearch())
    return chain


_original_chain = addons.chain


@asynccontextmanager
async def running_proxy(tmp_path: Path, upstream: str, config: dict[str, Any] | None = None,
                        monkeypatch: Any = None, debug: bool = False) -> AsyncIterator[str]:
    """`http://127.0.0.1:PORT` of a proxy whose upstream is `upstream`, trusted (as tests run)."""
    if monkeypatch is not None:
        monkeypatch.setattr(addons, "chain", pipeline_chain)
    state = tmp_path / "state"
    state.mkdir(parents=True, exist_ok=True)
    cfg_file = state / "config.json"
    cfg_file.write_text(json.dumps(config or {}))
    opts = UpOptions(listen_port=0, upstream=upstream, trust_upstream=True, with_tools=False, state_dir=state,
                     config_file=cfg_file, debug=debug)
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_up(opts, ready, stop))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if not ready.is_set():
        waiter.cancel()
        raise AssertionError("the proxy did not start" + (f": {task.exception()!r}" if task.done() else ""))
    try:
        yield json.loads((state / "run.json").read_text())["proxy"]  # the port it bound (listen_port 0)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def codex_turn(http: aiohttp.ClientSession, base: str, payload: dict[str, Any],
                     session_id: str = "sess-e2e") -> tuple[int, list[dict[str, Any]]]:
    """One streamed Codex-route turn: (status, decoded events)."""
    headers = {"authorization": f"Bearer {codex_token()}", "chatgpt-account-id": ACCOUNT, "session_id": session_id,
               "originator": "codex_cli_rs", "content-type": "application/json"}
    async with http.post(f"{base}/backend-api/codex/responses", data=orjson.dumps({**payload, "stream": True}),
                         headers=headers) as resp:
        raw = await resp.read()
        if not resp.headers.get("content-type", "").startswith("text/event-stream"):
            return resp.status, [orjson.loads(raw)] if raw else []
    dec = SSEDecoder()
    events = [orjson.loads(e.data) for e in [*dec.feed(raw), *dec.close()] if e.data and e.data != "[DONE]"]
    return resp.status, events


def completed_output_text(events: list[dict[str, Any]]) -> str:
    for ev in events:
        if ev.get("type") == "response.output_text.done":
            return ev.get("text", "")
    return ""


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": text}


async def wait_for_checkpoints(db_path: Path, predicate: Any = bool, timeout: float = 30.0) -> list[Any]:
    """Every session's checkpoints (remote/fallback journal windows), oldest first, once
    `predicate(checkpoints)` holds: the journal's writer commits them a moment after they were opened."""
    from proxy.db import connect
    from proxy.windows.remote import store

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        conn = connect(db_path)
        try:
            cps = [cp for key in store.sessions_with_checkpoints(conn) for cp in store.checkpoints(conn, key)]
        finally:
            conn.close()
        if predicate(cps) or loop.time() > deadline:
            return cps
        await asyncio.sleep(0.05)


async def wait_for_events(db_path: Path, predicate: Any, timeout: float = 10.0) -> list[tuple[str, str]]:
    """The (kind, outcome) compaction events once `predicate(events)` holds: the proxy writes them
    in a background thread, after the answer may already have reached the client."""
    from proxy.db import connect
    from proxy.windows.remote import store

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        conn = connect(db_path)
        try:
            events = [(e.kind, e.outcome) for e in store.events(conn)]
        finally:
            conn.close()
        if predicate(events) or loop.time() > deadline:
            return events
        await asyncio.sleep(0.05)
