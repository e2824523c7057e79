"""The `ctproxy` command line's parser: every subcommand, flag and help text (`ctproxy --help`); the commands
themselves are proxy/app/cli.py's."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from proxy import __version__
from proxy.config import (
    CAPABILITIES,
)
from proxy.sandbox.bwrap import MODES as SANDBOX_MODES

if TYPE_CHECKING:
    pass


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
                    "auto: one per CPU core (default: config proxy.workers, 1)")

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
