"""The `ctproxy` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.app.cli_parser import build_parser
from proxy.app.codexconfig import (
    CODEX_NAME,
    DEFAULT_PROXY,
    DEFAULT_TOOLS,
    CodexMergeError,
    codex_entries,
    merge_codex_config,
    render_codex_tables,
    toml_str,
)
from proxy.config import (
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
from proxy.state import StateDir, StateDirBusy

if TYPE_CHECKING:
    from proxy.store.choice import StoreChoice

def _state(args: argparse.Namespace) -> StateDir:
    return StateDir.open(args.state_dir)


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
                 f"model_provider = {toml_str(CODEX_NAME)}", *render_codex_tables(entries)]
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
