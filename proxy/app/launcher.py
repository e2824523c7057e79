"""`ctproxy up`: the embedded mitmproxy with the addon chain, and the tool server in its own process.

The tool server runs as a child process so tool work (shell output, patches, searches) can never stall
the proxy's event loop. Shutdown on SIGINT/SIGTERM closes the listeners first (mitmproxy keeps them
open otherwise), flushes the flows and the journal, then stops the tool server and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from proxy import __version__
from proxy.app import runtime
from proxy.app.upoptions import UpOptions
from proxy.config import with_run_flags
from proxy.errors import CtproxyError
from proxy.routes import parse_upstream
from proxy.state import StateDir

log = logging.getLogger("ctproxy")


def split_hostport(value: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return (host.strip("[]") or default_host), int(port)


def _mitm_mode(opts: UpOptions) -> str:
    if opts.mode == "regular":
        return "regular"
    upstream = parse_upstream(opts.upstream, opts.trust_upstream)
    return f"reverse:{upstream.origin or 'https://api.openai.com'}"


class ToolServerPortBusy(CtproxyError, RuntimeError):
    pass


def child_env(store_env: str | None) -> dict[str, str] | None:
    """A child's environment: ours, with CTPROXY_STORE set to the store this run chose (None: ours unchanged).
    The URL goes by the environment, never the command line, which any local user can read."""
    if store_env is None:
        return None
    from proxy.store.choice import ENV

    return {**os.environ, ENV: store_env}


# The line the tool server prints once it listens (tools_server/server.py): how it reports its port back.
_LISTENING = re.compile(rb"listening on http://(?:\[[^\]]*\]|[^\s:/]+):(\d+)")
# Its one-time dashboard login link (tools_server/ui): printed by `ctproxy up`, never logged elsewhere.
_LOGIN = re.compile(rb"dashboard login (http://\S+/ui/login\?code=[A-Za-z0-9_-]+)")


def _settle(fut: asyncio.Future[int | None], value: int | None) -> None:
    if not fut.done():
        fut.set_result(value)


class ToolServerProcess:
    """The tool server as a child process. It reports the port it listens on with its `listening on` line
    (stdout); until it is ready its stderr is kept, so a start-up failure becomes one line, not a traceback;
    afterwards its stderr goes to ours. With `--tools-listen HOST:0` the OS picks the port here and the child
    binds it itself and reports it (never a port picked here first, which another process could take)."""

    def __init__(self, opts: UpOptions, state: StateDir, config_file: Path | None = None,
                 telemetry_url: str | None = None, upstream_kind: str = "official", store_env: str | None = None):
        self.opts = opts
        self.upstream_kind = upstream_kind  # what the credentialed tools may use (tools_server --upstream)
        self.store_env = store_env  # CTPROXY_STORE for the child: the store `ctproxy up` chose
        self.telemetry_url = telemetry_url  # the proxy's loopback telemetry (proxy/app/telemetry.py)
        self.login_url: str | None = None
        self.state = state
        self.config_file = config_file or opts.config_file  # the config the tool server runs
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = opts.tools_port
        self._early_stderr: list[bytes] = []
        self._live = False
        self._out_lock = threading.Lock()

    @property
    def url(self) -> str:
        host = self.opts.tools_host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    async def start(self) -> None:
        self.port = self.opts.tools_port  # 0: the child binds a free one and reports it (_wait_ready)
        await self._start_once()

    async def _start_once(self) -> None:
        cmd = [sys.executable, "-m", "tools_server", "--listen", f"{self.opts.tools_host}:{self.port}",
               "--state-dir", str(self.state.root), "--parent-pid", str(os.getpid())]
        if self.opts.workspace is not None:
            cmd += ["--workspace", str(self.opts.workspace)]
        if self.config_file:
            cmd += ["--config", str(self.config_file)]
        for name in self.opts.enable:
            cmd += ["--enable", name]
        for name in self.opts.disable:
            cmd += ["--disable", name]
        if self.opts.sandbox is not None:
            cmd += ["--sandbox", self.opts.sandbox]
        if self.opts.debug:
            cmd.append("--debug")
        if self.telemetry_url:
            cmd += ["--proxy-telemetry", self.telemetry_url]
        cmd += ["--upstream", self.upstream_kind]
        # Its own process group, so a Ctrl-C on the terminal reaches us first and we stop it in order.
        self._early_stderr, self._live = [], False
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True, env=child_env(self.store_env))
        loop = asyncio.get_running_loop()
        listening: asyncio.Future[int | None] = loop.create_future()
        threading.Thread(target=self._read_stdout, args=(self, self.proc, loop, listening), daemon=True,
                         name="tool-server-stdout").start()
        threading.Thread(target=self._read_stderr, args=(self.proc,), daemon=True,
                         name="tool-server-stderr").start()
        try:
            await self._wait_ready(listening)
        except BaseException:
            await self.stop()  # a tool server that did not come up is not left running
            raise

    @staticmethod
    def _read_stdout(owner: ToolServerProcess, proc: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop,
                     listening: asyncio.Future[int | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # read to the end, so the child never blocks on a full pipe
            if owner.login_url is None and (login := _LOGIN.search(line)):
                owner.login_url = login[1].decode()  # printed before the listening line
            if not listening.done() and (m := _LISTENING.search(line)):
                with contextlib.suppress(RuntimeError):  # the loop may be gone
                    loop.call_soon_threadsafe(_settle, listening, int(m[1]))
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, listening, None)  # stdout closed: the process ended

    def _read_stderr(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            with self._out_lock:
                if self._live:
                    self._forward(line)
                else:
                    self._early_stderr = [*self._early_stderr[-199:], line]

    @staticmethod
    def _forward(line: bytes) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.buffer.write(line)
            sys.stderr.flush()

    def _go_live(self) -> None:
        """From now on the tool server's stderr (its warnings) is ours; what it said while starting too."""
        with self._out_lock:
            for line in self._early_stderr:
                self._forward(line)
            self._early_stderr, self._live = [], True

    def _startup_failure(self, code: int | None) -> RuntimeError:
        with self._out_lock:
            text = b"".join(self._early_stderr).decode(errors="replace")
        if self.opts.debug:
            sys.stderr.write(text)
        where = f"{self.opts.tools_host}:{self.port}"
        if "address already in use" in text.lower() or re.search(r"errno (98|48|10048)\b", text.lower()):
            return ToolServerPortBusy(f"the tool server could not listen on {where}: address already in use; "
                                      "choose another port with --tools-listen HOST:PORT (or --no-tools)")
        last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
        return RuntimeError(f"the tool server exited with code {code} while starting on {where}"
                            + (f": {last}" if last else "") + " (--debug shows its full output)")

    async def _wait_ready(self, listening: asyncio.Future[int | None]) -> None:
        assert self.proc is not None
        try:
            port = await asyncio.wait_for(asyncio.shield(listening), 30)
        except TimeoutError:
            raise RuntimeError("the tool server did not become ready within 30 s") from None
        if port is None:
            code = None
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = await asyncio.to_thread(self.proc.wait, 10)
            raise self._startup_failure(code)
        self.port = port
        token = self.state.token()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            try:
                async with http.get(self.url + "/healthz", headers={"Authorization": f"Bearer {token}"}) as resp:
                    ok = resp.status == 200
            except (aiohttp.ClientError, OSError, TimeoutError):
                ok = False
        if not ok:
            raise RuntimeError(f"the tool server said it listens on {self.url} but does not answer there")
        self._go_live()

    async def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        for _ in range(150):
            if self.proc.poll() is not None:
                return
            await asyncio.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _replay_file(path: Path, workdir: Path) -> Path:
    """The client's request bodies restored, each flow matchable whatever the scheme (proxy/app/replay.py)."""
    from proxy.app.replay import server_replay_file

    return server_replay_file(path, workdir)


def _bound_port(proxyserver: object, requested: int) -> int:
    """The port mitmproxy really listens on (what the OS chose for port 0)."""
    for server in getattr(proxyserver, "servers", ()):
        for addr in getattr(server, "listen_addrs", ()) or ():
            if len(addr) >= 2 and addr[1]:
                return int(addr[1])
    return requested


async def run_up(opts: UpOptions, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> int:
    from proxy import memory

    memory.one_heap()  # before the journal's and the store's threads start (proxy/memory.py)
    state = StateDir.open(opts.state_dir)
    rt = runtime.build(str(state.root), str(opts.config_file) if opts.config_file else None, opts.upstream,
                       opts.trust_upstream, opts.enable, opts.disable)
    with_run_flags(rt.config, debug=opts.debug, bridge=opts.bridge, sandbox=opts.sandbox, workers=opts.workers,
                   upstream_ca=opts.upstream_ca)
    use_upstream_ca(rt.config)  # a missing or unreadable file stops `ctproxy up` here, before anything starts
    state.token()
    # The state store, before anything is started: one that cannot be reached stops `ctproxy up` here, with what
    # to do, and nothing half-started (proxy/store/choice.py: --store > CTPROXY_STORE > store.url > embedded).
    from proxy.store.choice import open_store, resolve
    from proxy.store.postgres import StoreError

    try:
        choice = resolve(opts.store, rt.config.store.url)
        store = open_store(choice, state)
    except StoreError as exc:
        raise RuntimeError(str(exc)) from None
    rt.use_store(store, choice)
    try:
        return await _serve(opts, state, rt, ready, stop)
    finally:
        store.close()


def use_upstream_ca(config) -> None:  # config: proxy.config.Config
    """This process's extra upstream CAs (`upstream.ca_file`, proxy/upstream/trust.py); a bad file is a
    start-up error in words."""
    from proxy.upstream import trust

    try:
        path = trust.configure(config.upstream.ca_file)
    except trust.TrustError as exc:
        raise RuntimeError(str(exc)) from None
    if path is not None:
        config.upstream.ca_file = str(path)  # absolute: the tool server and the workers read the snapshot


async def _serve(opts: UpOptions, state: StateDir, rt: runtime.Runtime, ready: asyncio.Event | None,
                 stop: asyncio.Event | None) -> int:
    from proxy.app.status import write_run_config

    # One config snapshot for both processes, taken once: the tool server runs exactly what the proxy runs,
    # and `ctproxy status` (run.json) reports that, not the file, which may change while they run.
    n_workers = rt.config.proxy.worker_count()
    snapshot = write_run_config(state, rt.config) if opts.with_tools else None
    if n_workers > 1:  # the workers' telemetry, summed and merged by this process (proxy/app/workers.py)
        from proxy.app.workers import start_aggregate_telemetry

        telemetry = start_aggregate_telemetry(state) if opts.metrics and opts.with_tools else None
    else:
        telemetry = _start_telemetry(state, rt) if opts.metrics and opts.with_tools else None  # its one reader
    telemetry_url = telemetry.url if telemetry is not None else None
    upstream_kind = ("official" if rt.upstream.official or opts.mode == "regular" else
                     "trusted" if rt.upstream.trusted else "untrusted")
    choice = rt.services.store_choice
    tools = (ToolServerProcess(opts, state, config_file=snapshot, telemetry_url=telemetry_url,
                               upstream_kind=upstream_kind,
                               store_env=choice.env_value() if choice is not None else None)
             if opts.with_tools else None)
    try:
        if tools is not None:
            await tools.start()
        if n_workers > 1:
            from proxy.app.workers import Supervisor

            return await Supervisor(opts, state, rt, n_workers, tools, snapshot, telemetry, announce).run(ready, stop)
        return await _run_proxy(opts, state, rt, tools, ready, stop)
    finally:
        if tools is not None:
            await tools.stop()  # never leave the tool server behind, whatever happened
        if snapshot is not None:
            snapshot.unlink(missing_ok=True)
        if telemetry is not None:
            telemetry.stop()
        runtime.uninstall()
        from proxy import debuglog

        debuglog.restore_logging()  # the process may go on (tests, a host program): leave logging as found


def _start_telemetry(state: StateDir, rt: runtime.Runtime):  # -> proxy.app.telemetry.TelemetryServer
    """The proxy's metrics and recent requests on a loopback port for the tool server (proxy/app/telemetry.py)."""
    from proxy.app.telemetry import TelemetryServer, request_feed
    from proxy.metrics import proxy_metrics

    def backlog() -> int:
        journal = rt.services.journal
        return journal.writer.pending() if journal is not None else 0

    metrics = proxy_metrics()
    metrics.watch_journal_backlog(backlog)
    return TelemetryServer(state.token(), metrics, request_feed()).start()


@dataclass
class WorkerRole:
    """What a worker process of `ctproxy up --workers N` is told (proxy/app/workers.py): it prints one ready line
    for its supervisor instead of the banner, and leaves run.json to the supervisor."""

    index: int
    tools_url: str | None
    telemetry_url: str | None


@dataclass
class RemoteTools:
    """The supervisor's tool server, as a worker sees it (it neither starts nor stops it)."""

    url: str
    login_url: str | None = None
    proc: None = None


def _startup_error_check():  # -> mitmproxy.addons.errorcheck.ErrorCheckHandler (imported only here)
    """mitmproxy's collector of the errors logged while the proxy starts, without asyncio's reports about tasks
    that are not the proxy's: a garbage-collected client of the same process ("Task exception was never
    retrieved") stopped `ctproxy up` as if its port were taken. A server that did not start is still caught: it
    is not running."""
    from mitmproxy.addons.errorcheck import ErrorCheckHandler

    class StartupErrors(ErrorCheckHandler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name != "asyncio":
                super().emit(record)

    return StartupErrors()


async def _run_proxy(opts: UpOptions, state: StateDir, rt: runtime.Runtime,
                     tools: ToolServerProcess | RemoteTools | None, ready: asyncio.Event | None,
                     stop: asyncio.Event | None, worker: WorkerRole | None = None) -> int:
    from mitmproxy import options

    import addons
    from addons.chain_addon import ChainAddon
    from addons.launcher_only import RecordFlows, ReplayMiss
    from proxy.app.mitm_master import build_master

    mopts = options.Options(mode=[_mitm_mode(opts)], listen_host=opts.listen_host, listen_port=opts.listen_port,
                            confdir=str(state.confdir))
    master = build_master(mopts, with_termlog=False)  # --debug: ctproxy's own loggers only (issue 17)
    from proxy import debuglog

    debuglog.configure_logging(debug=opts.debug, request_log=not opts.quiet)
    # Not mitmproxy's ErrorCheck: it calls sys.exit() from inside the event loop when startup logs an error
    # (e.g. "address already in use"), which would skip our cleanup; collect those errors ourselves.
    startup_errors = _startup_error_check()
    startup_errors.install()
    chain = addons.chain()
    extra: list[object] = []
    if opts.record:
        from proxy.app.replay import RecordUpstream

        # Names the upstream on each flow before it is written, so `ctproxy replay` can run as recorded.
        extra += [RecordUpstream(opts.upstream, opts.trust_upstream, opts.mode), RecordFlows(opts.record)]
    if opts.server_replay:
        extra.insert(0, ReplayMiss())
    master.addons.add(ChainAddon([*chain, *extra]))  # one addon for mitmproxy to dispatch to (see the module)
    updates: dict[str, object] = dict(
        ctp_state_dir=str(state.root), ctp_config=str(opts.config_file or ""), ctp_upstream=opts.upstream or "",
        ctp_trust_upstream=opts.trust_upstream, ctp_enable=list(opts.enable), ctp_disable=list(opts.disable),
        store_streamed_bodies=bool(opts.record), connection_strategy="lazy",
        ctp_request_log=not opts.quiet, ctp_metrics=opts.metrics,
        ctp_tools_url=tools.url if tools is not None else "",  # addons/codex_backend.py: Codex's backend calls
    )
    tmp = tempfile.TemporaryDirectory(prefix="ctproxy-")
    from proxy.upstream import trust

    if (bundle := trust.mitm_bundle(Path(tmp.name))) is not None:  # --upstream-ca for mitmproxy's own upstream TLS
        updates["ssl_verify_upstream_trusted_ca"] = str(bundle)
    if opts.server_replay:
        updates.update(server_replay=[str(_replay_file(opts.server_replay, Path(tmp.name)))],
                       server_replay_ignore_host=True, server_replay_ignore_port=True,
                       server_replay_reuse=True, server_replay_extra="forward")
    master.options.update(**updates)
    runtime.install(rt)

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM) if sys.platform != "win32" else ():
        with contextlib.suppress(RuntimeError):  # no signal handlers outside the main thread
            loop.add_signal_handler(sig, stop.set)

    task = asyncio.create_task(master.run())
    proxyserver = master.addons.get("proxyserver")
    for _ in range(500):
        running = bool(proxyserver.servers) and all(s.is_running for s in proxyserver.servers)
        if running or task.done() or startup_errors.has_errored:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0)  # let pending log records arrive
    startup_errors.uninstall()
    if task.done() or startup_errors.has_errored or not running:
        for record in startup_errors.has_errored:
            print(f"ctproxy up: {record.getMessage().splitlines()[0]}", file=sys.stderr)
        print(f"ctproxy up: the proxy could not start on {opts.listen_host}:{opts.listen_port}; "
              "if the port is taken, choose another with --listen HOST:PORT", file=sys.stderr)
        await _shut_down(master, task)
        tmp.cleanup()
        return 1
    upstream_desc = "(regular mode: HTTPS proxy)" if opts.mode == "regular" else rt.upstream.describe()
    scheme_url = f"http://{opts.listen_host}:{_bound_port(proxyserver, opts.listen_port)}"  # --listen HOST:0
    from proxy import memory

    if worker is not None:
        import json

        from proxy.app.workers import READY_PREFIX

        memory.freeze_startup_heap()
        memory.keep_free_heap()
        print(READY_PREFIX + json.dumps({"index": worker.index, "pid": os.getpid(), "proxy": scheme_url,
                                         "telemetry": worker.telemetry_url,
                                         "websocket": _websocket_info(chain, master.options, rt.config)}),
              flush=True)
        if ready is not None:
            ready.set()
        code = await _serve_until_stopped(master, task, stop)
        tmp.cleanup()
        return code
    announce(opts, state, rt, tools, scheme_url, upstream_desc, _websocket_info(chain, master.options, rt.config))
    memory.freeze_startup_heap()  # the long-lived start-up heap out of the collector's walks (proxy/memory.py)
    memory.keep_free_heap()  # big bodies reuse freed heap pages instead of faulting new ones in (proxy/memory.py)
    if ready is not None:
        ready.set()

    code = await _serve_until_stopped(master, task, stop)
    tmp.cleanup()
    from proxy.app.status import RUN_FILE

    with contextlib.suppress(FileNotFoundError):
        (state.root / RUN_FILE).unlink()
    print("ctproxy stopped", flush=True)
    return code


async def _shut_down(master, task: asyncio.Task[None]) -> None:
    """Stop mitmproxy's master if it still runs, and wait for it."""
    if not task.done():
        await master.addons.get("proxyserver").servers.update([])  # actually closes the listening sockets
        master.shutdown()
    await task


async def _serve_until_stopped(master, task: asyncio.Task[None], stop: asyncio.Event) -> int:
    """Serve until `stop` is set (0) or mitmproxy's master ends by itself (1), then shut it down."""
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return 1
        await _shut_down(master, task)
        return 0
    finally:
        stopper.cancel()


def announce(opts: UpOptions, state: StateDir, rt: runtime.Runtime, tools: ToolServerProcess | RemoteTools | None,
             scheme_url: str, upstream_desc: str, websocket: dict[str, object],
             workers: list[dict[str, object]] | None = None) -> dict[str, object]:
    """The banner `ctproxy up` prints once it serves, and run.json (what `ctproxy status` reads): written by
    the one proxy process, or by the supervisor of `--workers N` (then with the workers and their pids)."""
    token_path = state.token_path
    lines = [
        f"ctproxy {__version__} is up",
        f"  proxy        {scheme_url}  mode={opts.mode}  upstream={upstream_desc}",
    ]
    if tools is not None:
        lines.append(f"  tool server  {tools.url}  (REST /v1/tools, MCP {tools.url}/mcp, metrics {tools.url}/metrics)")
        if tools.login_url:
            lines.append(f"  dashboard    {tools.login_url}  (one-time login link; `ctproxy dashboard` makes "
                         "another)")
        lines.append(f"  workspace    {opts.workspace}" if opts.workspace is not None else
                     "  workspace    none: apply_patch and exec_command refuse (start with --workspace DIR)")
    store = store_info(rt)
    lines += [
        f"  store        {store['url']}" + ("" if store["kind"] == "embedded" else
                                           "  (notes, pending rollovers and usage shared with every ctproxy on it)"),
        f"  state dir    {state.root}",
        f"  token file   {token_path}  (print it with `ctproxy token`)",
    ]
    if rt.config.upstream.ca_file:
        lines.append(f"  upstream CA  {rt.config.upstream.ca_file}  (trusted besides the system store)")
    if opts.record:
        lines.append(f"  recording    {opts.record}")
    if opts.server_replay:
        lines.append(f"  replaying    {opts.server_replay} (no upstream contacted for matched requests)")
    if opts.mode == "regular":
        lines.append(f"  point a client: export HTTPS_PROXY={scheme_url} and trust "
                     f"{state.confdir / 'mitmproxy-ca-cert.pem'}")
    else:
        lines.append(f"  point a client: export OPENAI_BASE_URL={scheme_url}/v1")
    if workers:
        lines.insert(2, f"  workers      {len(workers)} proxy processes on one listen address (pids "
                        + ", ".join(str(w["pid"]) for w in workers) + ")")
    lines.append("ctproxy ready (Ctrl-C stops)")
    from proxy.app.status import request_changes, write_run_file

    run_info = {"pid": os.getpid(), "proxy": scheme_url, "mode": opts.mode, "upstream": upstream_desc,
                "upstream_official": rt.upstream.official or opts.mode == "regular",
                "upstream_trusted": rt.upstream.trusted,
                "upstream_ca": rt.config.upstream.ca_file,
                "enable": list(opts.enable), "disable": list(opts.disable),
                "debug": opts.debug, "bridge": list(opts.bridge) if opts.bridge is not None else None,
                "sandbox": opts.sandbox, "workers_flag": opts.workers,
                "upstream_ca_flag": opts.upstream_ca,
                # what the tools that call OpenAI themselves can use (the tool server inherits it)
                "openai_api_key": bool(os.environ.get("OPENAI_API_KEY")),
                "tools": tools.url if tools is not None else None,
                "tools_pid": tools.proc.pid if tools is not None and tools.proc is not None else None,
                "workspace": str(opts.workspace) if opts.workspace is not None else None,
                "config": public_config(rt.config),  # what both processes run (no store password)
                "store": store_info(rt),
                "websocket": websocket}
    if workers:
        run_info["workers"] = workers
    write_run_file(state, run_info)
    lines.insert(2, f"  requests     {request_changes(rt.config, run_info)}  (details: ctproxy status)")
    print("\n".join(lines), flush=True)
    return run_info


def public_config(config: object) -> dict[str, object]:
    """The config as run.json and the tool server's snapshot keep it: `store.url` without its password (the tool
    server and the workers get the store from CTPROXY_STORE)."""
    from proxy.store.choice import public_url

    data = config.model_dump(mode="json")  # type: ignore[attr-defined]
    store = data.get("store") or {}
    if store.get("url"):
        store["url"] = public_url(store["url"])
    return data


def store_info(rt: runtime.Runtime) -> dict[str, object]:
    """Which store the running proxy serves from, for `ctproxy status` (never the password)."""
    choice = rt.services.store_choice
    if choice is None:
        return {"kind": "embedded", "url": "embedded", "source": "default"}
    return {"kind": choice.kind, "url": choice.public, "source": choice.source}


def replay_recording(path: Path, *, state_dir: Path | None = None, config_file: Path | None = None,
                     upstream: str | None = None, trust_upstream: bool = False, enable: list[str] | None = None,
                     disable: list[str] | None = None) -> list[str]:
    """`ctproxy replay`: the chain over recorded flows, offline. A throw-away state directory unless one is
    given, so a replay never writes into the real journal."""
    from mitmproxy import master, options

    import addons
    from proxy.app.replay import replay_flows

    async def run(state: Path) -> list[str]:
        chain = addons.chain()
        # A master of our own with only the chain's stages (no proxy server): what they need of mitmproxy
        # is its options and its `ctx`, which the master sets up.
        host = master.Master(options.Options())
        for stage in chain:
            host.addons.add(stage)
        host.options.update(ctp_state_dir=str(state), ctp_config=str(config_file or ""),
                            ctp_upstream=upstream or "", ctp_trust_upstream=trust_upstream,
                            ctp_enable=list(enable or []), ctp_disable=list(disable or []))
        try:
            return await replay_flows(path, chain)
        finally:
            for addon in chain:
                done = getattr(addon, "done", None)
                if done is not None and asyncio.iscoroutine(result := done()):
                    await result
            runtime.uninstall()

    with tempfile.TemporaryDirectory(prefix="ctproxy-replay-") as tmp:
        return asyncio.run(run(state_dir or Path(tmp)))


def _websocket_info(chain: list[object], options: object, config: object) -> dict[str, object]:
    """What the running proxy does with a Responses WebSocket (`ctproxy status`): whether the adapter stage is
    in the chain and on (`ctp_ws`), its message limit, and whether mitmproxy relays the socket as raw bytes."""
    stage = any(type(s).__name__ == "WebSocket" and type(s).__module__ == "addons.websocket" for s in chain)
    ws = config.websocket  # type: ignore[attr-defined]
    return {"adapter": stage and bool(getattr(options, "ctp_ws", False)),
            "max_message_bytes": ws.max_message_bytes,
            "raw_relay": bool(ws.raw_relay) and bool(getattr(options, "rawtcp", True))}
