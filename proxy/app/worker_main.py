"""One worker process of `ctproxy up --workers N` (docs/adr/0012-proxy-workers.md): started by the supervisor
(proxy/app/workers.py) with `python -m proxy.app.worker_main SPEC_JSON`, it serves the shared listen port with the
launcher's own chain and stops with its supervisor."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from proxy.state import StateDir


def _watch_parent(parent: int, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """A worker whose supervisor is gone (killed with -9) stops too, rather than serve on unsupervised."""
    while not stop.is_set():
        if os.getppid() != parent:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
            return
        time.sleep(0.5)


async def run_worker(spec: dict[str, Any]) -> int:
    from proxy.app import runtime
    from proxy.app.launcher import UpOptions
    from proxy.config import with_run_flags

    raw = dict(spec["opts"])
    for key in ("state_dir", "config_file", "workspace", "record", "server_replay"):
        if raw.get(key) is not None:
            raw[key] = Path(raw[key])
    opts = UpOptions(**raw)
    from proxy import memory

    memory.one_heap()  # before the journal's and the store's threads start (proxy/memory.py)
    state = StateDir.open(opts.state_dir)
    rt = runtime.build(str(state.root), str(opts.config_file) if opts.config_file else None, opts.upstream,
                       opts.trust_upstream, opts.enable, opts.disable)
    with_run_flags(rt.config, debug=opts.debug, bridge=opts.bridge, sandbox=opts.sandbox, upstream_ca=opts.upstream_ca)
    from proxy.app.launcher import use_upstream_ca

    try:
        use_upstream_ca(rt.config)
    except RuntimeError as exc:
        print(f"ctproxy worker {spec.get('index')}: {exc}", file=sys.stderr, flush=True)
        return 1
    from proxy.store.choice import open_store, resolve
    from proxy.store.postgres import StoreError

    try:  # this worker's own store (its own pool): CTPROXY_STORE, as the supervisor chose it
        choice = resolve(None, rt.config.store.url)
        store = open_store(choice, state)
    except StoreError as exc:
        print(f"ctproxy worker {spec.get('index')}: {exc}", file=sys.stderr, flush=True)
        return 1
    rt.use_store(store, choice)
    try:
        return await _serve_worker(spec, opts, state, rt)
    finally:
        store.close()


async def _serve_worker(spec: dict[str, Any], opts: Any, state: StateDir, rt: Any) -> int:
    from proxy.app import runtime
    from proxy.app.launcher import RemoteTools, WorkerRole, _run_proxy, _start_telemetry
    from proxy.app.mitm_master import share_listen_port

    share_listen_port()
    telemetry = _start_telemetry(state, rt) if opts.metrics else None
    tools_url = spec.get("tools_url")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    threading.Thread(target=_watch_parent, args=(int(spec["parent"]), loop, stop), daemon=True,
                     name="ctproxy-parent-watch").start()
    role = WorkerRole(int(spec["index"]), tools_url, telemetry.url if telemetry is not None else None)
    try:
        return await _run_proxy(opts, state, rt, RemoteTools(tools_url) if tools_url else None, None, stop, role)
    finally:
        if telemetry is not None:
            telemetry.stop()
        runtime.uninstall()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m proxy.app.worker_main SPEC_JSON (started by `ctproxy up --workers N`)", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run_worker(json.loads(args[0])))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
