"""ctproxy's in-process loopback endpoints (the bridge's, ADR 0007; the WebSocket adapter's, ADR 0009): an
aiohttp application on 127.0.0.1 and a port the kernel picks, started once on first use, and the one-time
jobs its routes are keyed by (`/<prefix>/<key>/<the client's own path>`)."""

from __future__ import annotations

import asyncio
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

JOB_TTL = 60.0
MAX_JOBS = 10_000


@dataclass
class Loopback:
    """One endpoint: `start(build)` serves the application `build()` makes, once (concurrent callers wait for
    the first), and answers its port; `close()` stops it."""

    port: int = 0
    _runner: web.AppRunner | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def start(self, build: Callable[[], web.Application]) -> int:
        if self._runner is None:
            async with self._lock:
                if self._runner is None:
                    # The caller hanging up (mitmproxy closes this connection) cancels the handler.
                    runner = web.AppRunner(build(), access_log=None, handle_signals=False,
                                           handler_cancellation=True)
                    await runner.setup()
                    site = web.TCPSite(runner, "127.0.0.1", 0)
                    await site.start()
                    self.port = runner.addresses[0][1]
                    self._runner = runner
        return self.port

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


def new_job[J](jobs: OrderedDict[str, tuple[float, J]], job: J, now: float,
               dropped: Callable[[str], None] | None = None) -> str:
    """Keep `job` under a new unguessable key (answered), after dropping the jobs older than JOB_TTL and the
    oldest beyond MAX_JOBS (`dropped` is told each key dropped)."""
    while jobs and (next(iter(jobs.values()))[0] < now - JOB_TTL or len(jobs) > MAX_JOBS):
        old, _ = jobs.popitem(last=False)
        if dropped is not None:
            dropped(old)
    key = secrets.token_urlsafe(18)
    jobs[key] = (now, job)
    return key


def job_path(prefix: str, key: str, path: str) -> str:
    """The path a request is re-routed to: the prefix, the job's key, then the request's own path."""
    return prefix + key + (path if path.startswith("/") else "/" + path)


def agent_path(path: str, *prefixes: str) -> str:
    """The path the client asked for, of a request re-routed under one of `prefixes`: what logs and the
    dashboard show (never the job's key)."""
    for prefix in prefixes:
        if path.startswith(prefix):
            rest = path[len(prefix):]
            cut = rest.find("/")
            return rest[cut:] if cut >= 0 else "/"
    return path
