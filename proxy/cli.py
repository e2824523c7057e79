"""The `ctproxy` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from proxy import __version__
from proxy.config import (
    CAPABILITIES,
    Config,
    ConfigError,
    config_path_from_env,
    get_key,
    load_config,
    save_config,
    set_key,
    with_overrides,
)
from proxy.state import StateDir, StateDirBusy

EPILOG = """\
Quick start:
  ctproxy up                                   # proxy on 127.0.0.1:8787, tool server on :8788
  export OPENAI_BASE_URL=http://127.0.0.1:8787/v1
  codex exec "…"   |   python my_agent.py

Environment: CTPROXY_HOME (state directory), CTPROXY_CONFIG (config file).
Capabilities: """ + ", ".join(CAPABILITIES)


def _common(p: argparse.ArgumentParser, top: bool = False) -> None:
    """`--state-dir` and `--config` go anywhere: before the command, after it, after its action. Only the
    top-level parser has a default; the others use SUPPRESS, so a subcommand that does not repeat the option
    keeps the value given further out (argparse would otherwise overwrite it with the subparser's default)."""
    default = None if top else argparse.SUPPRESS
    p.add_argument("--state-dir", type=Path, default=default,
                   help="state directory (default: $CTPROXY_HOME or ~/.local/state/ctproxy)")
    p.add_argument("--config", type=Path, default=default,
                   help="config file (default: $CTPROXY_CONFIG or <state dir>/config.json)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctproxy", description="A transparent proxy and tool server for the OpenAI Responses API.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ctproxy {__version__}")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    up = sub.add_parser("up", help="run the proxy (addon chain) and the tool server",
                        description="Start the embedded mitmproxy with the addon chain and the tool server. "
                        "Stops cleanly on Ctrl-C / SIGTERM.")
    _common(up)
    up.add_argument("--listen", default="127.0.0.1:8787", metavar="HOST:PORT",
                    help="proxy address (default %(default)s)")
    up.add_argument("--mode", choices=["reverse", "regular"], default="reverse",
                    help="reverse: clients use the proxy as their base URL (default); "
                    "regular: an HTTPS proxy (HTTPS_PROXY) with ctproxy's CA")
    up.add_argument("--upstream", metavar="URL", help="send requests here instead of the official OpenAI endpoints")
    up.add_argument("--trust-upstream", action="store_true",
                    help="forward credentials to a non-official --upstream (gateways, local emulators)")
    up.add_argument("--tools-listen", default="127.0.0.1:8788", metavar="HOST:PORT",
                    help="tool server address (default %(default)s)")
    up.add_argument("--no-tools", action="store_true", help="do not start the tool server")
    up.add_argument("--workspace", type=Path, default=Path.cwd(), help="root for file tools (default: cwd)")
    up.add_argument("--record", type=Path, metavar="FILE.mitm", help="record every flow to this file")
    up.add_argument("--server-replay", type=Path, metavar="FILE.mitm",
                    help="answer from recorded flows instead of the upstream (misses get HTTP 502)")
    up.add_argument("--enable", action="append", default=[], metavar="NAME", choices=CAPABILITIES,
                    help="enable a capability for this run (repeatable)")
    up.add_argument("--disable", action="append", default=[], metavar="NAME", choices=(*CAPABILITIES, "all"),
                    help="disable a capability for this run (repeatable; 'all' = a plain pass-through proxy; "
                    "remote_compaction includes overflow recovery)")
    up.add_argument("--debug", action="store_true", help="log categories, counts and timings (never content)")

    st = sub.add_parser("status", help="show every capability: active, deferred, unavailable or off, and why")
    _common(st)
    st.add_argument("--json", action="store_true", help="machine-readable output")

    rp = sub.add_parser("replay", help="run the addon chain over recorded flows and show what each addon changed")
    _common(rp)
    rp.add_argument("file", type=Path, metavar="FILE.mitm")
    rp.add_argument("--enable", action="append", default=[], metavar="NAME", choices=CAPABILITIES)
    rp.add_argument("--disable", action="append", default=[], metavar="NAME", choices=(*CAPABILITIES, "all"))
    rp.add_argument("--upstream", metavar="URL", help="the upstream the flows were recorded against")
    rp.add_argument("--trust-upstream", action="store_true")

    tk = sub.add_parser("token", help="print the tool server's bearer token (created if needed)")
    _common(tk)

    cf = sub.add_parser("config", help="show, get or set configuration (dotted keys, e.g. web_search.backend)")
    _common(cf)
    cfs = cf.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    _common(cfs.add_parser("show", help="print the effective configuration"))
    g = cfs.add_parser("get", help="print one key")
    _common(g)
    g.add_argument("key")
    s = cfs.add_parser("set", help="set one key (value parsed as JSON, else a string)")
    _common(s)
    s.add_argument("key")
    s.add_argument("value")

    ts = sub.add_parser("tasks", help="list tasks, agents, windows, items, compactions")
    _common(ts)
    t = sub.add_parser("task", help="task helpers")
    _common(t)
    tsub = t.add_subparsers(dest="task_command", metavar="ACTION", required=True)
    _common(tsub.add_parser("new", help="print a fresh task id to hand to sub-agents (x-ctp-task)"))
    return parser


def _state(args: argparse.Namespace) -> StateDir:
    return StateDir.open(args.state_dir)


def _config_path(args: argparse.Namespace, state: StateDir) -> Path:
    return config_path_from_env(state.root, args.config)


def cmd_up(args: argparse.Namespace) -> int:
    from proxy.launcher import UpOptions, run_up, split_hostport
    from proxy.routes import UpstreamError, parse_upstream

    try:
        host, port = split_hostport(args.listen)
        thost, tport = split_hostport(args.tools_listen)
        parse_upstream(args.upstream, args.trust_upstream)
    except (ValueError, UpstreamError) as exc:
        print(f"ctproxy up: {exc}", file=sys.stderr)
        return 2
    if args.trust_upstream and not args.upstream:
        print("ctproxy up: --trust-upstream needs --upstream URL", file=sys.stderr)
        return 2
    if args.server_replay:
        from proxy.replay import NotAFlowFile, count_flows

        try:
            if count_flows(args.server_replay) == 0:
                raise NotAFlowFile(f"{args.server_replay} holds no flows (nothing was recorded)")
        except NotAFlowFile as exc:
            print(f"ctproxy up: --server-replay: {exc}", file=sys.stderr)
            return 2
    state = _state(args)
    load_config(_config_path(args, state))  # fail early, with the key named
    try:
        lock = state.lock_for_up()
    except StateDirBusy:
        print(f"ctproxy up: {_already_running(state)}", file=sys.stderr)
        return 2
    opts = UpOptions(listen_host=host, listen_port=port, mode=args.mode, upstream=args.upstream,
                     trust_upstream=args.trust_upstream, tools_host=thost, tools_port=tport,
                     with_tools=not args.no_tools, state_dir=state.root, config_file=args.config,
                     workspace=args.workspace.resolve(), record=args.record, server_replay=args.server_replay,
                     enable=args.enable, disable=args.disable, debug=args.debug)
    try:
        return asyncio.run(run_up(opts))
    except KeyboardInterrupt:
        return 130
    except RuntimeError as exc:
        print(f"ctproxy up: {exc}", file=sys.stderr)
        return 1
    finally:
        if lock is not None:
            lock.release()


def _already_running(state: StateDir) -> str:
    from proxy.status import read_run_file

    run = read_run_file(state)
    who = (f"pid {run['pid']}, proxy {run.get('proxy')}" if run else "still starting")
    return (f"another ctproxy is already running with the state directory {state.root} ({who}); "
            "stop it first, or give this one its own --state-dir DIR")


def cmd_status(args: argparse.Namespace) -> int:
    """Not running: what `ctproxy up` would do with the file. Running: what the processes do (the config
    snapshot they started with, from run.json), with a note where the file now says otherwise."""
    from proxy.status import all_statuses, other_drift, read_run_file, render, running_config, tools_answering

    state = _state(args)
    path = _config_path(args, state)
    config = load_config(path)
    run = read_run_file(state)
    wanted: Config | None = None
    answering = None
    if run:
        # The file as `ctproxy up` would apply it now, with the running proxy's --enable/--disable.
        wanted = with_overrides(config, run.get("enable") or [], run.get("disable") or [])
        config = running_config(run) or wanted  # a run.json from an older ctproxy has no snapshot
        answering = tools_answering(state, run)
    file_config = wanted if run and wanted is not config else None
    if args.json:
        print(json.dumps({"state_dir": str(state.root), "config": str(path), "proxy": run,
                          "tools_answering": answering,
                          "pending": other_drift(config, file_config) if file_config is not None else [],
                          "capabilities": [s.__dict__ for s in all_statuses(config, run, file_config)]}, indent=2))
    else:
        print(render(config, state, path, run, file_config, answering))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from proxy.launcher import replay_recording
    from proxy.replay import NotAFlowFile, count_flows, recorded_upstream, replay_header
    from proxy.routes import UpstreamError, parse_upstream

    if args.trust_upstream and not args.upstream:
        print("ctproxy replay: --trust-upstream needs --upstream URL", file=sys.stderr)
        return 2
    try:
        parse_upstream(args.upstream, args.trust_upstream)
        if count_flows(args.file) == 0:
            print(f"ctproxy replay: {args.file} holds no flows (nothing was recorded)", file=sys.stderr)
            return 1
        recorded = recorded_upstream(args.file)
        upstream, trusted = args.upstream, args.trust_upstream
        if not upstream and recorded is not None:  # run the chain as it ran when recording
            upstream, trusted = recorded.url, recorded.trusted
        lines = replay_recording(args.file, state_dir=args.state_dir, config_file=args.config, upstream=upstream,
                                 trust_upstream=trusted, enable=args.enable, disable=args.disable)
    except (NotAFlowFile, UpstreamError) as exc:
        print(f"ctproxy replay: {exc}", file=sys.stderr)
        return 2
    print(replay_header(recorded, args.upstream, args.trust_upstream))
    for line in lines:
        print(line)
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    print(_state(args).token())
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    state = _state(args)
    path = _config_path(args, state)
    config = load_config(path)
    if args.config_command == "show":
        print(json.dumps(config.model_dump(mode="json"), indent=2))
    elif args.config_command == "get":
        print(json.dumps(get_key(config, args.key)))
    else:
        config = set_key(config, args.key, args.value)
        save_config(config, path)
        print(f"{args.key} = {json.dumps(get_key(config, args.key))}  (saved to {path})")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    try:
        from proxy.journal.cli_views import tasks_report
    except ImportError:
        print("ctproxy tasks: the journal is not part of this build", file=sys.stderr)
        return 1
    print(tasks_report(_state(args)))
    return 0


def cmd_task(args: argparse.Namespace) -> int:
    from proxy.journal.cli_views import new_task

    print(new_task(_state(args)))
    return 0


COMMANDS = {"up": cmd_up, "status": cmd_status, "replay": cmd_replay, "token": cmd_token,
            "config": cmd_config, "tasks": cmd_tasks, "task": cmd_task}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"ctproxy: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
