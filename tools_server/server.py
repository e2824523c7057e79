"""Run the tool server (used by `ctproxy up`, which starts it as its own process)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from aiohttp import web

from proxy.config import Config
from proxy.state import StateDir
from proxy.store.interface import Store
from tools_server.app import bind_port, create_app
from tools_server.registry import Services

log = logging.getLogger("ctproxy.tools")


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """If `ctproxy up` dies without stopping us (SIGKILL, a crash), stop too: no orphaned tool server."""
    while not stop.is_set():
        if os.getppid() != parent_pid:
            log.warning("the ctproxy process that started the tool server is gone; stopping")
            stop.set()
            return
        await asyncio.sleep(1.0)


async def serve(config: Config, state: StateDir, workspace: Path | None, host: str, port: int,
                ready: asyncio.Event | None = None, stop: asyncio.Event | None = None,
                parent_pid: int | None = None, proxy_telemetry: str | None = None,
                upstream: str = "official", store: Store | None = None) -> None:
    """`workspace=None`: no file or shell tool may touch a directory (they say how to set one).
    `upstream`: official | trusted | untrusted, the proxy's upstream (what the credentialed tools may use).
    `store`: the state store the notes and context tools use (None: the embedded store of `state`); the caller
    opened it and closes it."""
    services = Services(config=config, state=state, workspace=workspace.resolve() if workspace else None,
                        upstream_official=upstream == "official", upstream_trusted=upstream == "trusted",
                        store=store)
    app = create_app(services, token=state.token(), listen_host=host, port=port, proxy_telemetry=proxy_telemetry)
    # A REST client that hangs up cancels its call (a shell command it started is stopped, seed 004 §5.6).
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    if port == 0:  # the OS picked it: the Host check, the login link and the listening line need the real one
        port = int(runner.addresses[0][1])
        bind_port(app, port)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM) if sys.platform != "win32" else ():
        with contextlib.suppress(RuntimeError):  # no signal handlers outside the main thread
            loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(_watch_parent(parent_pid, stop)) if parent_pid else None
    if ready is not None:
        ready.set()
    from tools_server.ui import login_url

    # The dashboard's one-time login link, before the listening line: `ctproxy up` prints it (launcher.py).
    print(f"ctproxy tool server dashboard login {login_url(app, host, port)}", flush=True)
    print(f"ctproxy tool server listening on http://{host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        await runner.cleanup()  # runs family close(): stops shell sessions, removes captures
