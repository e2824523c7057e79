"""`python -m tools_server --listen 127.0.0.1:8788 --state-dir DIR [--config FILE] [--workspace DIR]`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from proxy.config import config_path_from_env, load_config, with_overrides, with_run_flags
from proxy.sandbox.bwrap import MODES as SANDBOX_MODES
from proxy.state import StateDir
from tools_server.server import serve


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools_server",
        description="ctproxy's tool server: REST /v1/tools, MCP /mcp, the bridge, /metrics and the dashboard /ui/. "
        "`ctproxy up` starts it; run it alone to serve the tools without the proxy.")
    parser.add_argument("--listen", default="127.0.0.1:8788", metavar="HOST:PORT",
                        help="address to listen on (default %(default)s; keep it on loopback)")
    parser.add_argument("--state-dir", type=Path, metavar="DIR",
                        help="state directory: journal, notes, token (default: $CTPROXY_HOME or "
                        "~/.local/state/ctproxy)")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="config file (default: $CTPROXY_CONFIG or <state dir>/config.json)")
    parser.add_argument("--workspace", type=Path, default=None,
                        help="the directory apply_patch and exec_command may change (no default: without it "
                        "they refuse; x-ctp-cwd may then pick a directory inside it)")
    parser.add_argument("--enable", action="append", default=[], metavar="NAME",
                        help="enable a capability for this run (repeatable)")
    parser.add_argument("--disable", action="append", default=[], metavar="NAME",
                        help="disable a capability for this run (repeatable; 'all' disables every one)")
    parser.add_argument("--sandbox", choices=SANDBOX_MODES, default=None,
                        help="shell.sandbox for this run: workspace-write, read-only or danger-full-access")
    parser.add_argument("--debug", action="store_true",
                        help="ctproxy's own loggers at debug (tool names, outcomes, timings; never arguments)")
    parser.add_argument("--proxy-telemetry", metavar="URL",
                        help="the proxy's loopback telemetry (set by `ctproxy up`): its metrics join /metrics and "
                        "its requests the dashboard")
    parser.add_argument("--upstream", choices=["official", "trusted", "untrusted"], default=None,
                        help="the proxy's upstream (set by `ctproxy up`): behind an untrusted one the tools that "
                        "call OpenAI can only use OPENAI_API_KEY, and web_search auto searches natively on an official "
                        "or trusted one, so the sidecar is listed only off one (default: unknown, judged official)")
    parser.add_argument("--parent-pid", type=int, metavar="PID",
                        help="stop when this process is gone (set by `ctproxy up`)")
    args = parser.parse_args()
    # Only ctproxy's loggers go to debug: asyncio, filelock, mcp and aiohttp stay at warning (issue 17).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("ctproxy").setLevel(logging.DEBUG if args.debug else logging.WARNING)
    state = StateDir.open(args.state_dir)
    config = with_overrides(load_config(config_path_from_env(state.root, args.config)), args.enable, args.disable)
    with_run_flags(config, sandbox=args.sandbox)
    from proxy.upstream import trust

    try:  # upstream.ca_file: images and the sidecar search trust it too (proxy/upstream/trust.py)
        trust.configure(config.upstream.ca_file)
    except trust.TrustError as exc:
        print(f"ctproxy tool server: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    if args.upstream is not None:  # web_search auto is native on an official or trusted upstream (issue 31)
        config.web_search.for_upstream(args.upstream != "untrusted")
    host, _, port = args.listen.rpartition(":")
    # The state store: CTPROXY_STORE (set by `ctproxy up` to the store it chose), else store.url, else embedded.
    from proxy.store.choice import open_store, resolve
    from proxy.store.postgres import StoreError

    try:
        store = open_store(resolve(None, config.store.url), state)
    except StoreError as exc:
        print(f"ctproxy tool server: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    try:
        asyncio.run(serve(config, state, args.workspace, host.strip("[]") or "127.0.0.1", int(port),
                          parent_pid=args.parent_pid, proxy_telemetry=args.proxy_telemetry,
                          upstream=args.upstream or "official", store=store))
    finally:
        store.close()


if __name__ == "__main__":
    main()
