"""The `ctproxy` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    with_run_flags,
)
from proxy.errors import CtproxyError
from proxy.sandbox.bwrap import MODES as SANDBOX_MODES
from proxy.state import StateDir, StateDirBusy

if TYPE_CHECKING:
    from proxy.store.choice import StoreChoice

EPILOG = """\
Quick start:
  ctproxy up                                   # proxy on 127.0.0.1:8787, tool server on :8788
  export OPENAI_BASE_URL=http://127.0.0.1:8787/v1
  codex exec "…"   |   python my_agent.py

Environment: CTPROXY_HOME (state directory), CTPROXY_CONFIG (config file), CTPROXY_STORE (the state store:
postgresql://USER@HOST:PORT/DB or embedded; `ctproxy up --store` overrides it, it overrides store.url).
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


def _families(value: str) -> list[str]:
    """`--bridge history,notes,context`: names checked against the bridgeable capabilities."""
    from proxy.config import BRIDGEABLE

    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in BRIDGEABLE]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown family {', '.join(unknown)}; choose from {', '.join(BRIDGEABLE)}")
    return list(dict.fromkeys(names))


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
    up.add_argument("--upstream-ca", metavar="FILE",
                    help="PEM file of extra CAs to trust for upstream TLS (a TLS-inspecting corporate proxy, a "
                    "private gateway certificate), added to the system store; config upstream.ca_file")
    up.add_argument("--tools-listen", default="127.0.0.1:8788", metavar="HOST:PORT",
                    help="tool server address (default %(default)s)")
    up.add_argument("--no-tools", action="store_true", help="do not start the tool server")
    up.add_argument("--workspace", type=Path, default=None,
                    help="the directory apply_patch and exec_command may change (no default: without it they "
                         "refuse; a client's x-ctp-cwd header may pick a directory inside it)")
    up.add_argument("--record", type=Path, metavar="FILE.mitm", help="record every flow to this file")
    up.add_argument("--server-replay", type=Path, metavar="FILE.mitm",
                    help="answer from recorded flows instead of the upstream (misses get HTTP 502)")
    up.add_argument("--enable", action="append", default=[], metavar="NAME", choices=CAPABILITIES,
                    help="enable a capability for this run (repeatable)")
    up.add_argument("--disable", action="append", default=[], metavar="NAME", choices=(*CAPABILITIES, "all"),
                    help="disable a capability for this run (repeatable; 'all' = a plain pass-through proxy; "
                    "remote_compaction includes overflow recovery)")
    up.add_argument("--bridge", metavar="FAMILIES", default=None, type=_families,
                    help="for this run, bridge these tool families (comma-separated, e.g. history,notes,context): "
                    "every agent gets their tools and ctproxy runs the calls (docs/bridge.md); '' = none")
    up.add_argument("--sandbox", choices=SANDBOX_MODES, default=None, metavar="MODE",
                    help="for this run, shell.sandbox: workspace-write (default: the workspace and a private /tmp "
                    "writable, .git read-only, no network unless shell.network), read-only, or danger-full-access "
                    "(unsandboxed); bubblewrap, docs/shell.md")
    up.add_argument("--debug", action="store_true",
                    help="ctproxy's own loggers at debug: categories, counts and timings (never content)")
    up.add_argument("--quiet", action="store_true",
                    help="no request log (by default one line per request: method, path, status, ms, stages)")
    up.add_argument("--no-metrics", action="store_true",
                    help="no Prometheus metrics and no live requests on the dashboard (the tool server's /metrics "
                    "then shows only its own)")
    up.add_argument("--store", default=None, metavar="URL",
                    help="where the state lives: postgresql://USER@HOST:PORT/DB shares notes, pending rollovers "
                    "and usage with every `ctproxy up` on that database (each keeps its own --state-dir for its "
                    "token, CA and run files); 'embedded' = the state directory's own store (the default). "
                    "Precedence: --store > $CTPROXY_STORE > config store.url > embedded. Keep a password out of "
                    "the URL (PGPASSWORD or ~/.pgpass); it is never shown. Unreachable at start: ctproxy up exits")
    up.add_argument("--workers", type=_workers, default=None, metavar="N|auto",
                    help="proxy worker processes on the one listen address (Linux), one tool server and one state; "
                    "auto: one per CPU core (default: proxy.app.workers, 1)")

    st = sub.add_parser("status", help="show every capability: active, deferred, unavailable or off, and why")
    _common(st)
    st.add_argument("--json", action="store_true", help="machine-readable output")

    rp = sub.add_parser("replay", help="run the addon chain over recorded flows and show what each addon changed")
    _common(rp)
    rp.add_argument("file", type=Path, metavar="FILE.mitm", help="flows recorded with `ctproxy up --record`")
    rp.add_argument("--enable", action="append", default=[], metavar="NAME", choices=CAPABILITIES,
                    help="enable a capability for the replay (repeatable), as `ctproxy up --enable`")
    rp.add_argument("--disable", action="append", default=[], metavar="NAME", choices=(*CAPABILITIES, "all"),
                    help="disable a capability for the replay (repeatable; 'all' = pass-through)")
    rp.add_argument("--upstream", metavar="URL",
                    help="the upstream the flows were recorded against (default: the one the recording names)")
    rp.add_argument("--trust-upstream", action="store_true",
                    help="treat --upstream as trusted with credentials, as `ctproxy up --trust-upstream` did")

    tk = sub.add_parser("token", help="print the tool server's bearer token (created if needed)")
    _common(tk)

    cf = sub.add_parser("config", help="show, get or set configuration (dotted keys, e.g. web_search.backend)")
    _common(cf)
    cfs = cf.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    _common(cfs.add_parser("show", help="print the effective configuration"))
    g = cfs.add_parser("get", help="print one key")
    _common(g)
    g.add_argument("key", help="a dotted key, e.g. web_search.backend")
    s = cfs.add_parser("set", help="set one key (value parsed as JSON, else a string)")
    _common(s)
    s.add_argument("key", help="a dotted key, e.g. web_search.backend")
    s.add_argument("value", help="the new value: JSON (true, 0.8, [\"a\"]) or else a plain string")

    ts = sub.add_parser("tasks", help="list tasks, newest first: label, agents, sessions, windows, counts",
                        description="Tasks from the journal, newest activity first. Each has a label (its first "
                        "user words and its agents), its agents' sessions and each session's windows.")
    _common(ts)
    ts.add_argument("--json", action="store_true", help="machine-readable output")
    ts.add_argument("--limit", type=int, default=None, metavar="N", help="only the N newest tasks")
    ts.add_argument("--store", metavar="URL", default=None,
                    help="read this store (postgresql://USER@HOST:PORT/DB or embedded); default: CTPROXY_STORE, "
                         "store.url, else the store of the proxy running on this state directory")
    sh = sub.add_parser("show", help="one session or task: windows and items (role, type, preview)",
                        description="A session (or each session of a task): its windows with strategy and "
                        "bootstrap, and its items with role, type and a preview of the text. A unique prefix of "
                        "the id is enough. `--item ID` prints one item's JSON as first seen.")
    _common(sh)
    sh.add_argument("ref", metavar="SESSION|TASK", help="a session key or a task id (or a unique prefix)")
    sh.add_argument("--item", metavar="ID", help="print this item whole (its JSON)")
    sh.add_argument("--limit", type=int, default=None, metavar="N", help="only the last N items of each session")
    sh.add_argument("--json", action="store_true", help="machine-readable output")
    sh.add_argument("--store", metavar="URL", default=None,
                    help="read this store (postgresql://USER@HOST:PORT/DB or embedded); default: CTPROXY_STORE, "
                         "store.url, else the store of the proxy running on this state directory")
    db = sub.add_parser("dashboard", help="print a new one-time login link for the dashboard (the tool server's /ui/)",
                        description="Asks the running tool server for a fresh one-time login link (valid 10 "
                        "minutes). Opening it sets an HttpOnly cookie; the page URLs carry no token after that.")
    _common(db)
    t = sub.add_parser("task", help="task helpers")
    _common(t)
    tsub = t.add_subparsers(dest="task_command", metavar="ACTION", required=True)
    tnew = tsub.add_parser("new", help="print a fresh task id to hand to sub-agents (x-ctp-task)")
    _common(tnew)
    tnew.add_argument("--store", metavar="URL", default=None,
                      help="register it in this store (postgresql://USER@HOST:PORT/DB or embedded); default: "
                           "CTPROXY_STORE, store.url, else the store of the proxy running on this state directory")
    sp = sub.add_parser("store", help="the state store: copy an embedded state into PostgreSQL")
    _common(sp)
    ssub = sp.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    mig = ssub.add_parser("migrate", help="copy this state directory's database and notes into an empty "
                          "PostgreSQL database (its schema created or brought up to date first)",
                          description="Copies the embedded state into PostgreSQL in one transaction. "
                          "`ctproxy up --store URL` then serves the journal, notes, pending rollovers, usage and "
                          "compaction records from it (docs/adr/0013-one-store-interface.md).")
    _common(mig)
    mig.add_argument("--to", required=True, metavar="URL", help="postgresql://USER@HOST:PORT/DB")
    ctxp = sub.add_parser("context", help="context windows: mark a manual checkpoint")
    _common(ctxp)
    csub = ctxp.add_subparsers(dest="context_command", metavar="ACTION", required=True)
    cp = csub.add_parser("checkpoint", help="the session's next request runs the checkpoint turn and rolls over",
                         description="Seed 000's /compact: marks the session (or a task's agent) so that, before its "
                         "next request is forwarded, ctproxy runs the checkpoint turn and starts a new window.")
    _common(cp)
    cp.add_argument("session", nargs="?", metavar="SESSION", help="a journal session key (see `ctproxy tasks`)")
    cp.add_argument("--task", metavar="ID", help="the task (instead of a session)")
    cp.add_argument("--agent", metavar="ADDRESS", help="the agent of --task (default /root; relative under /root)")
    cp.add_argument("--store", metavar="URL", default=None,
                    help="mark it in this store (postgresql://USER@HOST:PORT/DB or embedded); default: "
                         "CTPROXY_STORE, store.url, else the store of the proxy running on this state directory")

    cx = sub.add_parser(
        "codex-config", help="print (or --write) the Codex CLI config.toml entries that use ctproxy",
        description="Codex CLI through ctproxy in one step: the model provider (the proxy) and the MCP server "
        "(the tool server's /mcp with its bearer token), both tagged with the same task and agent headers, and "
        "the MCP approval setting `codex exec` needs. Addresses come from the running ctproxy (else the "
        "defaults of `ctproxy up`).")
    _client_config_args(cx, "Codex", "config.toml (e.g. ~/.codex/config.toml)",
                        "the ctproxy tables are replaced whole")
    cx.add_argument("--tools-url", metavar="URL", help="the tool server's address (default: the running one's)")
    cx.add_argument("--chatgpt", action="store_true",
                    help="Codex signed in with ChatGPT: use its login (requires_openai_auth) and the "
                    "/backend-api/codex route instead of an API key")
    cx.add_argument("--token-env", metavar="VAR",
                    help="read the tool server's token from this environment variable (bearer_token_env_var) "
                    "instead of writing it into the file")
    cx.add_argument("--no-mcp", action="store_true", help="only the model provider, no MCP server")
    cx.add_argument("--web-search", choices=("off", "on"),
                    help="send x-ctp-web-search with Codex's model requests: off = ctproxy injects no hosted web "
                    "search into them (when web_search.enabled is on, on official routes; billed as hosted search)")
    cx.add_argument("--remote-compaction", choices=("v2", "unsupported"),
                    help="[model_providers.ctproxy.capabilities] remote_compaction (Codex >= 0.162): v2 sends "
                    "Codex's compactions through ctproxy to the upstream's compaction (default where the running "
                    "ctproxy's upstream is official or trusted, or ctproxy is not running); unsupported: Codex "
                    "compacts locally (default for any other upstream)")

    pc = sub.add_parser(
        "pi-config", help="print (or --write) the Pi models.json provider that uses ctproxy",
        description="Pi (npm @earendil-works/pi-coding-agent; @mariozechner/… up to 0.73.1) ignores "
        "OPENAI_BASE_URL for its built-in OpenAI provider: this writes a provider `ctproxy` (OpenAI Responses "
        "API, the proxy's /v1, the task and agent headers) into Pi's models.json; then `pi --provider ctproxy "
        "--model gpt-5`. Each Pi session stays its own session in that task (Pi sends its session id as "
        "prompt_cache_key).")
    _client_config_args(pc, "Pi", "models.json (e.g. ~/.pi/agent/models.json)", "providers.ctproxy is replaced whole")
    pc.add_argument("--model", action="append", metavar="ID",
                    help="a model Pi may pick under this provider (repeatable; default gpt-5)")
    pc.add_argument("--web-search", choices=["on", "off"],
                    help="send x-ctp-web-search on every request: off keeps ctproxy from adding web search")
    return parser


def _client_config_args(p: argparse.ArgumentParser, client: str, file: str, replaced: str) -> None:
    """What `codex-config` and `pi-config` share: where to write, whose traffic it is, where ctproxy is."""
    _common(p)
    p.add_argument("--write", type=Path, metavar="PATH",
                   help=f"merge into this {file} instead of printing; {replaced}, everything else is kept")
    p.add_argument("--task", metavar="ID",
                   help=f"x-ctp-task for {client}'s traffic (default: a fresh `ctproxy task new`)")
    p.add_argument("--agent", default="/root", metavar="ADDRESS", help="x-ctp-agent (default %(default)s)")
    p.add_argument("--proxy", metavar="URL", help="the proxy's address (default: the running ctproxy's)")
    p.add_argument("--env-key", default="OPENAI_API_KEY", metavar="VAR",
                   help=f"environment variable with the API key {client} sends (default %(default)s)")


def _state(args: argparse.Namespace) -> StateDir:
    return StateDir.open(args.state_dir)


def _workers(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError("N (1..64) or auto") from None
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError("N (1..64) or auto")
    return n


def _config_path(args: argparse.Namespace, state: StateDir) -> Path:
    return config_path_from_env(state.root, args.config)


def cmd_up(args: argparse.Namespace) -> int:
    from proxy.app.launcher import UpOptions, run_up, split_hostport
    from proxy.routes import UpstreamURLError, parse_upstream

    try:
        host, port = split_hostport(args.listen)
        thost, tport = split_hostport(args.tools_listen)
        parse_upstream(args.upstream, args.trust_upstream)
    except (ValueError, UpstreamURLError) as exc:
        print(f"ctproxy up: {exc}", file=sys.stderr)
        return 2
    if args.trust_upstream and not args.upstream:
        print("ctproxy up: --trust-upstream needs --upstream URL", file=sys.stderr)
        return 2
    if args.server_replay:
        from proxy.app.replay import NotAFlowFile, count_flows

        try:
            if count_flows(args.server_replay) == 0:
                raise NotAFlowFile(f"{args.server_replay} holds no flows (nothing was recorded)")
        except NotAFlowFile as exc:
            print(f"ctproxy up: --server-replay: {exc}", file=sys.stderr)
            return 2
    if args.store is not None:
        from proxy.store.choice import check_url
        from proxy.store.postgres import StoreError

        try:
            check_url(args.store)
        except StoreError as exc:
            print(f"ctproxy up: --store: {exc}", file=sys.stderr)
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
                     workspace=args.workspace.resolve() if args.workspace else None, record=args.record,
                     server_replay=args.server_replay,
                     enable=args.enable, disable=args.disable, debug=args.debug, quiet=args.quiet,
                     metrics=not args.no_metrics, bridge=args.bridge, sandbox=args.sandbox, workers=args.workers,
                     store=args.store,
                     upstream_ca=str(Path(args.upstream_ca).expanduser().resolve()) if args.upstream_ca else None)
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
    from proxy.app.status import read_run_file

    run = read_run_file(state)
    who = (f"pid {run['pid']}, proxy {run.get('proxy')}" if run else "still starting")
    return (f"another ctproxy is already running with the state directory {state.root} ({who}); "
            "stop it first, or give this one its own --state-dir DIR")


def cmd_status(args: argparse.Namespace) -> int:
    """Not running: what `ctproxy up` would do with the file. Running: what the processes do (the config
    snapshot they started with, from run.json), with a note where the file now says otherwise."""
    from proxy.app.status import (
        all_statuses,
        bridge_report,
        other_drift,
        read_run_file,
        render,
        running_config,
        store_reachable,
        with_running_desktop,
        with_tools_health,
    )

    state = _state(args)
    path = _config_path(args, state)
    config = load_config(path)
    run = read_run_file(state)
    wanted: Config | None = None
    answering = None
    if run:
        # The file as `ctproxy up` would apply it now, with the running proxy's --enable/--disable.
        wanted = with_run_flags(with_overrides(config, run.get("enable") or [], run.get("disable") or []),
                                debug=bool(run.get("debug")), bridge=run.get("bridge"), sandbox=run.get("sandbox"),
                                workers=run.get("workers_flag"), upstream_ca=run.get("upstream_ca_flag"))
        config = running_config(run) or wanted  # a run.json from an older ctproxy has no snapshot
        run, answering = with_tools_health(state, run)  # the running server's word on its capabilities
    file_config = wanted if run and wanted is not config else None
    reach = store_reachable(run, load_config(path).store.url)
    if args.json:
        print(json.dumps({"state_dir": str(state.root), "config": str(path), "proxy": run,
                          "tools_answering": answering,
                          "store": {**run["store"], "reachable": reach[0], "detail": reach[1]}
                          if run and isinstance(run.get("store"), dict) and reach is not None else None,
                          "pending": other_drift(config, file_config) if file_config is not None else [],
                          "capabilities": [s.__dict__ for s in with_running_desktop(
                              all_statuses(config, run, file_config), state, run)],
                          "bridge": [{**b.__dict__, "tools": list(b.tools)}
                                     for b in bridge_report(config, run, state)]},
                         indent=2))
    else:
        print(render(config, state, path, run, file_config, answering, reach))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from proxy.app.launcher import replay_recording
    from proxy.app.replay import NotAFlowFile, count_flows, recorded_upstream, replay_header
    from proxy.routes import UpstreamURLError, parse_upstream

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
    except (NotAFlowFile, UpstreamURLError) as exc:
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
        print(json.dumps(_shown(config).model_dump(mode="json"), indent=2))
    elif args.config_command == "get":
        print(json.dumps(get_key(_shown(config), args.key)))
    else:
        config = set_key(config, args.key, args.value)
        save_config(config, path)
        print(f"{args.key} = {json.dumps(get_key(_shown(config), args.key))}  (saved to {path})")
    return 0


def _shown(config: Config) -> Config:
    """The configuration as it may be printed: a store URL's password (and query options) left out, as status
    and the logs do (the file keeps what the user set)."""
    from proxy.store.choice import public_url

    url = config.store.url
    if not url or public_url(url) == url:
        return config
    return config.model_copy(update={"store": config.store.model_copy(update={"url": public_url(url)})})


def cmd_tasks(args: argparse.Namespace) -> int:
    import dataclasses

    from proxy.app import sessionview
    from proxy.store.postgres import StoreError

    if args.limit is not None and args.limit < 1:
        print("ctproxy tasks: --limit must be at least 1", file=sys.stderr)
        return 2
    try:
        conn, close = _view_db(args, "tasks")
    except StoreError as exc:
        print(f"ctproxy tasks: {exc}", file=sys.stderr)
        return 1
    try:
        tasks = sessionview.list_tasks(conn, args.limit)
    finally:
        close()
    if args.json:
        print(json.dumps([dataclasses.asdict(t) | {"sessions": t.sessions, "items": t.items,
                                                   "bridged_rounds": t.bridged_rounds,
                                                   "bridged_calls": t.bridged_calls} for t in tasks], indent=2))
    else:
        print(sessionview.render_tasks(tasks))
    return 0


def _view_db(args: argparse.Namespace, command: str) -> tuple[Any, Callable[[], None]]:
    """The journal `ctproxy tasks` / `ctproxy show` read, and how to let it go: the view of the store the proxies
    serve from (`_cli_store`; `Store.view()`): the state directory's database, or a read-only connection of a
    PostgreSQL store (proxy/store/pgview.py)."""
    from proxy.store.choice import open_store

    state = _state(args)
    store = open_store(_cli_store(args, state), state)
    try:
        view = store.view()
    except Exception:
        store.close()
        raise

    def close() -> None:
        try:
            view.close()
        finally:
            store.close()
    return view, close


def cmd_show(args: argparse.Namespace) -> int:
    import dataclasses

    from proxy.app import sessionview
    from proxy.store.postgres import StoreError
    from proxy.windows import cache_stats

    try:
        conn, close = _view_db(args, "show")
    except StoreError as exc:
        print(f"ctproxy show: {exc}", file=sys.stderr)
        return 1
    try:
        if args.item:
            found = sessionview.item_raw(conn, args.item)
            if found is None:
                print(f"ctproxy show: no item {args.item!r} in the journal", file=sys.stderr)
                return 1
            view, raw = found
            print(json.dumps({"item": dataclasses.asdict(view), "raw": raw}, indent=2) if args.json
                  else sessionview.render_item(view, raw))
            return 0
        ref = sessionview.resolve(conn, args.ref)
        if ref is None:
            print(f"ctproxy show: no session or task {args.ref!r} (or the prefix is not unique); "
                  "`ctproxy tasks` lists them", file=sys.stderr)
            return 1
        kind, key = ref
        if kind == "session":
            found_session = sessionview.find_session(conn, key)
            sessions = [found_session] if found_session is not None else []
        else:
            sessions = [s for t in sessionview.list_tasks(conn, task_id=key) for a in t.agents for s in a.sessions]
        shown = [(s, sessionview.session_items(conn, s.session_key, args.limit)) for s in sessions]
        caches = {s.session_key: cache_stats.read(conn, s.session_key) for s in sessions}  # issue 47
    finally:
        close()
    if args.json:
        print(json.dumps([dataclasses.asdict(s) | {"item_list": [dataclasses.asdict(i) for i in items],
                                                   "prompt_cache": cache_stats.totals(caches[s.session_key]) | {
                                                       "windows": [dataclasses.asdict(w)
                                                                   for w in caches[s.session_key]]}}
                          for s, items in shown], indent=2))
    elif not shown:
        print(f"task {key}: no sessions yet")
    else:
        print("\n\n".join(sessionview.render_session(s, items) + "\n" + cache_stats.render(caches[s.session_key])
                           for s, items in shown))
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    import urllib.error
    import urllib.request

    from proxy.app.status import read_run_file

    state = _state(args)
    run = read_run_file(state)
    tools = (run or {}).get("tools")
    if not tools:
        print("ctproxy dashboard: no running tool server (start `ctproxy up`, without --no-tools)", file=sys.stderr)
        return 1
    req = urllib.request.Request(tools.rstrip("/") + "/ui/login-codes", method="POST", data=b"",
                                 headers={"Authorization": f"Bearer {state.token()}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            print(json.loads(resp.read())["url"])
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        print(f"ctproxy dashboard: the tool server at {tools} did not give a link ({exc})", file=sys.stderr)
        return 1
    return 0


def cmd_task(args: argparse.Namespace) -> int:
    from proxy.store.postgres import StoreError

    try:
        print(_new_task(args, _state(args)))
    except StoreError as exc:
        print(f"ctproxy {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


def _new_task(args: argparse.Namespace, state: StateDir) -> str:
    """A fresh task id, registered in the store the proxies serve from (`_cli_store`); StoreError when it cannot be
    reached."""
    from proxy.app.journal_views import new_task
    from proxy.store.choice import open_store

    choice = _cli_store(args, state)
    if choice.url is None:
        return new_task(state)
    store = open_store(choice, state)
    try:
        return new_task(state, store.journal())
    finally:
        store.close()


def _cli_store(args: argparse.Namespace, state: StateDir) -> StoreChoice:
    """The store a CLI command reaches: `--store`, CTPROXY_STORE or `store.url` as `ctproxy up` chooses, else the
    one the proxy running on this state directory serves from (run.json names it without a password, which then
    comes from PGPASSWORD or ~/.pgpass), else the embedded store."""
    from proxy.app.status import read_run_file
    from proxy.store.choice import StoreChoice, resolve

    choice = resolve(getattr(args, "store", None), load_config(_config_path(args, state)).store.url)
    if choice.source != "default":
        return choice
    running = (read_run_file(state) or {}).get("store") or {}
    if running.get("kind") == "postgresql" and running.get("url"):
        return StoreChoice(running["url"], "the running proxy")
    return choice


def cmd_store(args: argparse.Namespace) -> int:
    from proxy.store.postgres import StoreError, copy_state

    state = _state(args)
    try:
        lock = state.lock_for_up()  # a consistent copy: no `ctproxy up` writes the state meanwhile
    except StateDirBusy:
        print(f"ctproxy store migrate: {_already_running(state)}", file=sys.stderr)
        return 2
    try:
        report = copy_state(state, args.to, lambda table, n: print(f"  {table:<24} {n} rows", flush=True))
    except StoreError as exc:
        print(f"ctproxy store migrate: {exc}", file=sys.stderr)
        return 1
    finally:
        if lock is not None:
            lock.release()
    applied = ", ".join(map(str, report.migrations)) or "none (up to date)"
    print(f"copied {sum(report.rows.values())} rows from {state.root} (schema migrations applied: {applied})")
    return 0


def cmd_context(args: argparse.Namespace) -> int:
    from proxy.app.status import read_run_file, running_config
    from proxy.store.choice import open_store
    from proxy.store.postgres import StoreError
    from proxy.windows.notes.checkpoint import CheckpointTargetError, mark_checkpoint

    if bool(args.session) == bool(args.task) or (args.agent and not args.task):
        print("ctproxy context checkpoint: give SESSION, or --task ID [--agent ADDRESS]", file=sys.stderr)
        return 2
    state = _state(args)
    # Refused now, with the reason, when the proxy that will serve it cannot: the running one's configuration
    # if a proxy runs, else the file's (the next `ctproxy up`).
    config = running_config(read_run_file(state)) or load_config(_config_path(args, state))
    try:  # the store the proxies serve from (`_cli_store`), as `ctproxy task new` reaches it
        store = open_store(_cli_store(args, state), state)
    except StoreError as exc:
        print(f"ctproxy context checkpoint: {exc}", file=sys.stderr)
        return 1
    try:
        pending = mark_checkpoint(store, args.session, args.task, args.agent, "cli", config)
    except CheckpointTargetError as exc:
        print(f"ctproxy context checkpoint: {exc.message}", file=sys.stderr)
        return 1
    except StoreError as exc:
        print(f"ctproxy context checkpoint: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    print(f"checkpoint pending for {pending.address} in task {pending.task_id}: its next request runs the "
          "checkpoint turn and starts a new window")
    return 0


# ---- ctproxy codex-config ---------------------------------------------------------------------------

CODEX_NAME = "ctproxy"  # the key of the provider and of the MCP server in Codex's config.toml
DEFAULT_PROXY = "http://127.0.0.1:8787"
DEFAULT_TOOLS = "http://127.0.0.1:8788"


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string (ASCII, \u escapes) is a valid TOML basic string


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_str(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value).__name__)


def codex_entries(*, proxy: str, tools: str | None, token: str | None, token_env: str | None, task: str,
                  agent: str, env_key: str, chatgpt: bool, web_search: str | None = None,
                  remote_compaction: str | None = None) -> dict[str, object]:
    """The Codex CLI (0.171; 0.169 reads them too) settings that route it through ctproxy, as the dict `tomllib`
    reads back. `web_search`: the per-client search switch (`x-ctp-web-search: off|on` on the model requests).
    `remote_compaction`: the provider capability (`v2` | `unsupported`); Codex keeps its provider default without
    it (local compaction, since ctproxy's provider is not named "OpenAI")."""
    ident = {"x-ctp-task": task, "x-ctp-agent": agent}
    provider: dict[str, object] = {"name": "ctproxy", "wire_api": "responses"}
    if chatgpt:  # the ChatGPT login's token goes to chatgpt.com/backend-api/codex, through ctproxy
        provider |= {"base_url": proxy.rstrip("/") + "/backend-api/codex", "requires_openai_auth": True}
    else:
        provider |= {"base_url": proxy.rstrip("/") + "/v1", "env_key": env_key}
    provider["http_headers"] = dict(ident) | ({"x-ctp-web-search": web_search} if web_search else {})
    if remote_compaction is not None:
        provider["capabilities"] = {"remote_compaction": remote_compaction}
    entries: dict[str, object] = {"model_provider": CODEX_NAME, "model_providers": {CODEX_NAME: provider}}
    if tools:
        server: dict[str, object] = {"url": tools.rstrip("/") + "/mcp"}
        if token_env:
            server["bearer_token_env_var"] = token_env
            server["http_headers"] = dict(ident)
        else:
            server["http_headers"] = {"Authorization": f"Bearer {token}", **ident}
        # Codex asks before running an MCP tool that may write; `codex exec` cannot ask, so without this every
        # such call fails with "MCP tool call requires approval, but approval policy is never".
        server["default_tools_approval_mode"] = "approve"
        entries["mcp_servers"] = {CODEX_NAME: server}
    return entries


def render_codex_tables(entries: dict[str, object]) -> list[str]:
    """The `[model_providers.ctproxy]` and `[mcp_servers.ctproxy]` tables (no top-level keys)."""
    lines: list[str] = []
    for table in ("model_providers", "mcp_servers"):
        body = entries.get(table)
        if not isinstance(body, dict):
            continue
        lines += ["", f"[{table}.{CODEX_NAME}]"]
        if table == "mcp_servers":
            lines.append("# ctproxy's tool server over MCP; the approval mode lets `codex exec` run its tools")
        lines += [f"{k} = {_toml_value(v)}" for k, v in body[CODEX_NAME].items()]
    return lines


_HEADER = re.compile(r"^\s*\[(?!\[)\s*([^\[\]]+?)\s*\](?:\s*#.*)?\s*$")
_ARRAY_HEADER = re.compile(r"^\s*\[\[")
_MODEL_PROVIDER = re.compile(r"^\s*(model_provider|\"model_provider\"|'model_provider')\s*=")


def _ours(header: str) -> bool:
    key = re.sub(r"[\s\"']", "", header)
    return any(key == f"{t}.{CODEX_NAME}" or key.startswith(f"{t}.{CODEX_NAME}.")
               for t in ("model_providers", "mcp_servers"))


class CodexMergeError(CtproxyError, ValueError):
    pass


def merge_codex_config(existing: str, entries: dict[str, object]) -> str:
    """`existing` with the top-level `model_provider` set and the ctproxy tables replaced (or added); every
    other line kept as it was. Checked by reading the result back: it must equal the old settings with
    exactly these changes, else CodexMergeError (then nothing should be written)."""
    import copy
    import tomllib

    try:
        before = tomllib.loads(existing)
    except tomllib.TOMLDecodeError as exc:
        raise CodexMergeError(f"it is not valid TOML ({exc})") from None
    lines = existing.splitlines()
    kept: list[str] = []
    skipped: list[str] = []
    skipping = False
    first_header: int | None = None

    def give_back_trailing_comments() -> None:
        # Comments (and blank lines) at the end of a removed table belong to what follows it.
        tail: list[str] = []
        while skipped and (not skipped[-1].strip() or skipped[-1].lstrip().startswith("#")):
            tail.insert(0, skipped.pop())
        kept.extend(tail)
        skipped.clear()

    for line in lines:
        m = _HEADER.match(line)
        if m or _ARRAY_HEADER.match(line):
            if skipping:
                give_back_trailing_comments()
            skipping = bool(m) and _ours(m.group(1))
            if not skipping and first_header is None:
                first_header = len(kept)
        (skipped if skipping else kept).append(line)
    if skipping:
        give_back_trailing_comments()
    top_end = first_header if first_header is not None else len(kept)
    provider_line = f"model_provider = {_toml_str(CODEX_NAME)}"
    for i in range(top_end):
        if _MODEL_PROVIDER.match(kept[i]):
            kept[i] = provider_line
            break
    else:
        insert = [provider_line]
        while top_end > 0 and not kept[top_end - 1].strip():
            top_end -= 1  # before the blank lines that separate the top level from the first table
        kept[top_end:top_end] = insert
    while kept and not kept[-1].strip():
        kept.pop()
    merged = "\n".join([*kept, *render_codex_tables(entries)]).lstrip("\n") + "\n"

    expected = copy.deepcopy(before)
    expected["model_provider"] = CODEX_NAME
    for table in ("model_providers", "mcp_servers"):
        section = expected.get(table)
        if isinstance(section, dict):
            section.pop(CODEX_NAME, None)
        if table in entries:
            expected.setdefault(table, {})[CODEX_NAME] = entries[table][CODEX_NAME]  # type: ignore[index]
    try:
        after = tomllib.loads(merged)
    except tomllib.TOMLDecodeError as exc:
        raise CodexMergeError(f"its layout could not be merged line by line ({exc})") from None
    for data in (after, expected):  # a table left empty by removing ctproxy's entry may or may not remain
        for table in ("model_providers", "mcp_servers"):
            if data.get(table) == {}:
                data.pop(table)
    if after != expected:
        raise CodexMergeError("its layout could not be merged line by line (ctproxy settings outside "
                              f"[model_providers.{CODEX_NAME}] / [mcp_servers.{CODEX_NAME}] tables?)")
    return merged


def _client_addresses(args: argparse.Namespace, state: StateDir, client: str,
                      want_tools: bool) -> tuple[str, str | None, list[str]]:
    """(proxy URL, tool server URL or None, notes for the user) for a client's config: the running ctproxy's
    addresses unless given, else the defaults of `ctproxy up`."""
    from proxy.app.status import read_run_file

    run = read_run_file(state)
    notes: list[str] = []
    proxy = args.proxy or (run or {}).get("proxy")
    tools = (args.tools_url or (run or {}).get("tools")) if want_tools else None
    if run is None and not args.proxy:
        proxy = DEFAULT_PROXY
        notes.append("ctproxy is not running: using the default addresses of `ctproxy up` (--proxy"
                     + ("/--tools-url" if want_tools else "") + " to choose)")
    if run is None and want_tools and not args.tools_url:
        tools = DEFAULT_TOOLS
    if run is not None and run.get("mode") == "regular" and not args.proxy:
        notes.append(f"the running ctproxy is an HTTPS proxy (--mode regular): {client} would need HTTPS_PROXY "
                     "and the CA, not a base URL; these entries assume reverse mode")
    if run is not None and want_tools and not tools:
        notes.append("the running ctproxy has no tool server (--no-tools): no MCP server entry")
    return proxy, tools, notes


def _codex_remote_compaction(state: StateDir, notes: list[str]) -> str:
    """v2 where the upstream can answer Codex's `compaction_trigger` with its one `compaction` item (an official
    upstream, or one the user trusts as OpenAI's API); else Codex compacts locally. ctproxy does not yet answer a
    compaction itself for any other upstream (issue 44 (2)), and a v2 request it cannot answer fails Codex's turn
    ("expected exactly one compaction output item")."""
    from proxy.app.status import read_run_file

    run = read_run_file(state)
    if run is None or run.get("upstream_official") or run.get("upstream_trusted"):
        return "v2"
    notes.append("the running ctproxy's upstream is neither official nor trusted: remote_compaction = "
                 "\"unsupported\" (Codex compacts locally; --remote-compaction v2 to choose otherwise)")
    return "unsupported"


def cmd_codex_config(args: argparse.Namespace) -> int:
    from proxy.files import atomic_write_text

    state = _state(args)
    proxy, tools, notes = _client_addresses(args, state, "Codex", want_tools=not args.no_mcp)
    if not args.agent.startswith("/"):
        print(f"ctproxy codex-config: --agent must be an address such as /root, got {args.agent!r}",
              file=sys.stderr)
        return 2
    task = args.task or _new_task(args, state)
    compaction = args.remote_compaction or _codex_remote_compaction(state, notes)
    entries = codex_entries(proxy=proxy, tools=tools, token=None if args.token_env else state.token(),
                            token_env=args.token_env, task=task, agent=args.agent, env_key=args.env_key,
                            chatgpt=args.chatgpt, web_search=args.web_search, remote_compaction=compaction)
    for note in notes:
        print(f"ctproxy codex-config: {note}", file=sys.stderr)
    if args.write is None:
        lines = [f"# Codex CLI through ctproxy (`ctproxy codex-config`): task {task}, agent {args.agent}",
                 f"model_provider = {_toml_str(CODEX_NAME)}", *render_codex_tables(entries)]
        print("\n".join(lines))
        return 0
    path = args.write.expanduser()
    try:
        existing = path.read_text(encoding="utf-8") if path.exists() else ""
        merged = merge_codex_config(existing, entries)
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o600  # it holds the tool server's token
        atomic_write_text(path, merged, mode=mode)
    except CodexMergeError as exc:
        print(f"ctproxy codex-config: left {path} unchanged: {exc}; print the entries with "
              "`ctproxy codex-config` and add them by hand", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"ctproxy codex-config: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    what = "model_provider, [model_providers.ctproxy]" + (", [mcp_servers.ctproxy]" if tools else "")
    print(f"wrote {what} to {path} (task {task}, agent {args.agent})")
    return 0


def cmd_pi_config(args: argparse.Namespace) -> int:
    from proxy.app.piconfig import PI_NAME, PiMergeError, merge_pi_models, pi_provider
    from proxy.files import atomic_write_text

    state = _state(args)
    proxy, _, notes = _client_addresses(args, state, "Pi", want_tools=False)
    if not args.agent.startswith("/"):
        print(f"ctproxy pi-config: --agent must be an address such as /root, got {args.agent!r}", file=sys.stderr)
        return 2
    try:
        windows = load_config(_config_path(args, state)).model_windows
    except ConfigError as exc:
        print(f"ctproxy pi-config: {exc}", file=sys.stderr)
        return 2
    task = args.task or _new_task(args, state)
    provider = pi_provider(proxy=proxy, task=task, agent=args.agent, env_key=args.env_key,
                           models=args.model or ["gpt-5"], windows=windows, web_search=args.web_search)
    for note in notes:
        print(f"ctproxy pi-config: {note}", file=sys.stderr)
    if args.write is None:
        print(merge_pi_models("", provider), end="")
        return 0
    path = args.write.expanduser()
    try:
        existing = path.read_text(encoding="utf-8") if path.exists() else ""
        merged = merge_pi_models(existing, provider)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, merged, mode=path.stat().st_mode & 0o777 if path.exists() else 0o600)
    except PiMergeError as exc:
        print(f"ctproxy pi-config: left {path} unchanged: {exc}; print the entry with `ctproxy pi-config` and "
              "add it by hand", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"ctproxy pi-config: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote providers.{PI_NAME} to {path} (task {task}, agent {args.agent}); "
          f"run: pi --provider {PI_NAME} --model {provider['models'][0]['id']}")
    return 0


COMMANDS = {"up": cmd_up, "status": cmd_status, "replay": cmd_replay, "token": cmd_token,
            "config": cmd_config, "tasks": cmd_tasks, "task": cmd_task, "codex-config": cmd_codex_config,
            "pi-config": cmd_pi_config,
            "show": cmd_show, "dashboard": cmd_dashboard, "context": cmd_context, "store": cmd_store}


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
    except CtproxyError as exc:  # e.g. a store that cannot be reached: what to do, not a traceback
        print(f"ctproxy {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
