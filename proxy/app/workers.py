"""`ctproxy up --workers N`: N proxy processes on one listen address, one tool server, one state directory.

One Python process forwards on one core; `--workers N` (config `proxy.workers`, `auto`: one per core) runs N
of them (docs/adr/0012-proxy-workers.md). The process the user started becomes the supervisor: it starts the
tool server as before, holds the listen port, and starts each worker with `python -m proxy.app.worker_main`. A worker
is the usual embedded mitmproxy with the whole chain; it binds the listen address with SO_REUSEPORT (the kernel
spreads new connections over the workers) and reports, on one stdout line, its pid and its loopback telemetry.

Nothing a request needs lives in one worker only: the journal's writes go to the shared database, and each
worker checks a session's stamp there before using what it cached (proxy/journal/journal.py); pending
rollovers are taken with one `DELETE … RETURNING` and announced through the stamp file (proxy/windows/notes/
rollover.py); the bridge's loopback endpoint is inside the worker whose flow it serves; credentials are handed
to the tool server by whichever worker saw them.

The supervisor writes run.json (the workers and their pids, for `ctproxy status`), serves the workers' metrics
summed and their request records merged to the tool server (proxy/app/telemetry.py), restarts a worker that dies,
and on Ctrl-C / SIGTERM stops every worker, then the tool server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from proxy import workerid
from proxy.state import StateDir

if TYPE_CHECKING:
    from proxy.app import runtime
    from proxy.app.telemetry import AggregateFeed, TelemetryServer
    from proxy.app.upoptions import UpOptions


class HasUrl(Protocol):
    """The tool server the launcher started (proxy.app.launcher.ToolServerProcess): its workers are told its URL."""

    url: str


# The launcher's banner and run file (proxy.app.launcher.announce), handed in: the launcher imports this module.
Announce = Callable[..., dict[str, Any]]

log = logging.getLogger("ctproxy")

READY_PREFIX = "ctproxy-worker-ready "
START_TIMEOUT = 60.0  # seconds for a worker to listen (the chain's imports take a few on a busy machine)
STOP_GRACE = 15.0  # seconds between SIGTERM and SIGKILL when stopping a worker
RESTART_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)  # a worker that keeps dying at once is restarted ever more slowly


def supported() -> str | None:
    """None when this platform can run several workers; else why not."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "SO_REUSEPORT"):
        return "--workers N needs Linux (SO_REUSEPORT spreads connections over the workers); run one worker here"
    return None


def hold_port(host: str, port: int) -> socket.socket:
    """A socket bound to the listen address with SO_REUSEPORT and never listening: it keeps the port (also one
    the OS picked for port 0) for the workers, which bind it the same way and listen, while it gets no
    connections itself."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
    except OSError:
        sock.close()
        raise
    return sock


def make_ca(state: StateDir) -> None:
    """mitmproxy's CA in the state's confdir, made once here before any worker starts: each worker's mitmproxy
    makes one when the directory has none, so workers starting together each made their own and one file
    survived. Clients trust that file (HTTPS proxy mode, HTTP/3 in reverse mode): a worker signing with another
    CA failed their TLS handshakes."""
    from mitmproxy import certs
    from mitmproxy.options import CONF_BASENAME, Options

    certs.CertStore.from_store(state.confdir, CONF_BASENAME, Options().key_size)


def start_aggregate_telemetry(state: StateDir) -> TelemetryServer:
    """The telemetry port the tool server reads (`--proxy-telemetry`): the workers' metrics summed and their
    request records merged; workers are added as they report ready (`Supervisor`)."""
    from proxy.app.telemetry import AggregateFeed, AggregateMetrics, TelemetryServer

    token = state.token()
    feed = AggregateFeed(token)
    return TelemetryServer(token, AggregateMetrics(token, feed.urls), feed).start()


@dataclass
class WorkerProcess:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    info: dict[str, Any] = field(default_factory=dict)  # its ready line
    restarts: int = 0
    started_at: float = 0.0
    failures: int = 0  # deaths in a row soon after start (the restart backoff)


class Supervisor:
    def __init__(self, opts: UpOptions, state: StateDir, rt: runtime.Runtime, n: int,
                 tools: HasUrl | None, snapshot: Path | None, telemetry: TelemetryServer | None,
                 announce: Announce):
        self.opts, self.state, self.rt, self.n = opts, state, rt, n
        self.tools, self.snapshot, self.telemetry = tools, snapshot, telemetry
        self.announce = announce
        self.workers = [WorkerProcess(i) for i in range(1, n + 1)]
        self.port = opts.listen_port
        self._stopping = False
        self._run_info: dict[str, Any] | None = None

    @property
    def feed(self) -> AggregateFeed | None:
        from proxy.app.telemetry import AggregateFeed

        feed = self.telemetry.feed if self.telemetry is not None else None
        return feed if isinstance(feed, AggregateFeed) else None

    def _command(self, w: WorkerProcess) -> list[str]:
        opts = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.opts).items()}
        opts.update(listen_port=self.port, workers=None, store=None,  # the store: CTPROXY_STORE (_start)
                    config_file=str(self.snapshot) if self.snapshot is not None else opts["config_file"])
        spec = {"opts": opts, "index": w.index, "tools_url": self.tools.url if self.tools is not None else None,
                "parent": os.getpid()}
        return [sys.executable, "-m", "proxy.app.worker_main", json.dumps(spec)]

    async def _start(self, w: WorkerProcess) -> bool:
        env = {**os.environ, workerid.WORKER_ENV: str(w.index)}
        choice = self.rt.services.store_choice
        if choice is not None:  # the store this run chose, by the environment (never on the command line)
            from proxy.store.choice import ENV

            env[ENV] = choice.env_value()
        # Its own session: a Ctrl-C on the terminal reaches the supervisor, which stops the workers in order.
        w.proc = subprocess.Popen(self._command(w), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env,
                                  start_new_session=True)
        w.started_at = time.monotonic()
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[dict[str, Any] | None] = loop.create_future()
        threading.Thread(target=_read_stdout, args=(w.proc, loop, ready), daemon=True,
                         name=f"ctproxy-worker-{w.index}-stdout").start()
        try:
            info = await asyncio.wait_for(asyncio.shield(ready), START_TIMEOUT)
        except TimeoutError:
            info = None
        if info is None:
            await self._stop_one(w)
            return False
        w.info = info
        if self.feed is not None:
            self.feed.set_worker(w.index, info.get("telemetry"))
        return True

    async def _stop_one(self, w: WorkerProcess) -> None:
        proc = w.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)

    def workers_info(self) -> list[dict[str, Any]]:
        return [{"index": w.index, "pid": w.proc.pid if w.proc is not None else None, "restarts": w.restarts}
                for w in self.workers]

    def _write_run_file(self) -> None:
        from proxy.app.status import write_run_file

        if self._run_info is not None:
            self._run_info["workers"] = self.workers_info()
            write_run_file(self.state, self._run_info)

    async def run(self, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> int:
        from proxy.app.status import RUN_FILE

        if (why := supported()) is not None:
            print(f"ctproxy up: {why}", file=sys.stderr)
            return 2
        try:
            holder = hold_port(self.opts.listen_host, self.opts.listen_port)
        except OSError as exc:
            print(f"ctproxy up: the proxy could not listen on {self.opts.listen_host}:{self.opts.listen_port} "
                  f"({exc.strerror or exc}); if the port is taken, choose another with --listen HOST:PORT",
                  file=sys.stderr)
            return 1
        self.port = holder.getsockname()[1]
        make_ca(self.state)
        from proxy import debuglog

        debuglog.configure_logging(debug=self.opts.debug, request_log=not self.opts.quiet)  # its warnings
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
        try:
            started = await asyncio.gather(*(self._start(w) for w in self.workers))
            if not all(started):
                failed = [str(w.index) for w, ok in zip(self.workers, started, strict=True) if not ok]
                print(f"ctproxy up: worker {', '.join(failed)} did not start (its errors are above)", file=sys.stderr)
                return 1
            first = self.workers[0].info
            upstream_desc = ("(regular mode: HTTPS proxy)" if self.opts.mode == "regular"
                             else self.rt.upstream.describe())
            self._run_info = self.announce(self.opts, self.state, self.rt, self.tools, str(first.get("proxy")),
                                      upstream_desc, first.get("websocket") or {}, self.workers_info())
            if ready is not None:
                ready.set()
            await self._watch(stop)
            return 0
        finally:
            self._stopping = True
            await asyncio.gather(*(self._stop_one(w) for w in self.workers))
            holder.close()
            if self.feed is not None:
                self.feed.stop()
            if self._run_info is not None:
                with contextlib.suppress(FileNotFoundError):
                    (self.state.root / RUN_FILE).unlink()
                print("ctproxy stopped", flush=True)

    async def _watch(self, stop: asyncio.Event) -> None:
        """Until stopped: a worker that exits is restarted (the others keep serving meanwhile)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)
            if stop.is_set():
                return
            for w in self.workers:
                if w.proc is None or (code := w.proc.poll()) is None:
                    continue
                quick = time.monotonic() - w.started_at < 10
                w.failures = w.failures + 1 if quick else 0
                delay = RESTART_BACKOFF[min(w.failures, len(RESTART_BACKOFF) - 1)]
                log.warning("ctproxy: worker %d (pid %d) exited with %s; restarting it in %.1fs", w.index,
                            w.proc.pid, f"signal {-code}" if code < 0 else f"code {code}", delay)
                if self.feed is not None:
                    self.feed.set_worker(w.index, None)
                w.proc = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    return
                w.restarts += 1
                if not await self._start(w):
                    log.warning("ctproxy: worker %d did not come back; retrying", w.index)
                    w.proc = w.proc or _Exited()  # type: ignore[assignment]
                    w.started_at = time.monotonic()
                self._write_run_file()


class _Exited:
    """Stands for a worker that failed to start, so the watch loop tries again."""

    pid = 0

    @staticmethod
    def poll() -> int:
        return 1


def _read_stdout(proc: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop,
                 ready: asyncio.Future[dict[str, Any] | None]) -> None:
    def settle(value: dict[str, Any] | None) -> None:
        if not ready.done():
            ready.set_result(value)

    assert proc.stdout is not None
    for line in proc.stdout:  # read to the end, so the worker never blocks on a full pipe
        text = line.decode("utf-8", "replace")
        if text.startswith(READY_PREFIX) and not ready.done():
            try:
                info = json.loads(text[len(READY_PREFIX):])
            except json.JSONDecodeError:
                info = None
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, info)
        elif text.strip():
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.write(text)
                sys.stdout.flush()
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle, None)
