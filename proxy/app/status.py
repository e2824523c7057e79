"""`ctproxy status`: every capability from both seeds with active / deferred / unavailable / off and why.

With ctproxy running, status describes what the running processes do: `ctproxy up` takes one snapshot of
the config at start (the file plus `--enable/--disable`), runs the proxy and the tool server on it, and
records it in `run.json`. Neither process re-reads the file, so a capability switched with `ctproxy config
set` while it runs is reported as it runs, with the note `config says enabled; restart ctproxy to apply`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from proxy.capabilities import capability
from proxy.config import CAPABILITIES, Config
from proxy.sandbox.bwrap import describe, find_prlimit, limits_of, pids_cgroup, sandbox_problem
from proxy.state import StateDir

RUN_FILE = "run.json"
RUN_CONFIG_FILE = "run.config.json"  # the config snapshot both processes of a running ctproxy run on
DESKTOP_FILE = "desktop.json"  # the tool server's private Computer Use desktop, once started (display, pid)


# The four states, one meaning each: `deferred` is only "held back behind find_tools" (seed 004 §5.8), never
# "starts on first use" (that is `active`); `unavailable` means every call would fail, so nothing offers it.
DEFERRED_MEANS = "held back by tool discovery until the model loads it with find_tools"


@dataclass(frozen=True)
class CapabilityStatus:
    name: str
    state: str  # active | deferred | unavailable | off
    reason: str
    pending: str = ""  # running ctproxy only: the config file says otherwise (a restart applies it)


def capability_status(config: Config, name: str, upstream_official: bool = True,
                      upstream_trusted: bool = False, run: dict | None = None) -> CapabilityStatus:
    st = _capability_status(config, name, upstream_official, upstream_trusted, run)
    return _as_the_server_says(st, run)


TOOLS_HEALTH = "tools_health"  # run-dict key `ctproxy status` fills with the running tool server's /healthz


def _as_the_server_says(st: CapabilityStatus, run: dict | None) -> CapabilityStatus:
    """With a running ctproxy, a tool-server capability is what that server says (seed004 N8, N9): unavailable
    while the server does not answer; unavailable for the server's own reason (it imported shell.policy with its
    PYTHONPATH, not the status process's)."""
    health = (run or {}).get(TOOLS_HEALTH)
    if health is None or st.state not in ("active", "deferred") or capability(st.name).runs_in != "tool server":
        return st
    if health is False:
        return CapabilityStatus(st.name, "unavailable", "the tool server is not answering (restart ctproxy)",
                                st.pending)
    why = (health.get("unavailable") or {}).get(st.name) if isinstance(health, dict) else None
    return CapabilityStatus(st.name, "unavailable", str(why), st.pending) if why else st


def _capability_status(config: Config, name: str, upstream_official: bool, upstream_trusted: bool,
                       run: dict | None) -> CapabilityStatus:
    cap = capability(name)
    what, built = cap.summary, cap.built
    if name == "sidecar_search":  # its switch is web_search.backend (issue 15)
        from proxy.transforms.web_search import sidecar_status

        st = CapabilityStatus(name, *sidecar_status(config.web_search, upstream_official, upstream_trusted))
        return _needs_api_key(st, upstream_official, upstream_trusted, run)
    section = getattr(config, name)
    if not section.enabled and name not in ("web_search", "remote_compaction"):
        hint = "" if built else "; not built in this version yet"
        if run and (name in (run.get("disable") or []) or "all" in (run.get("disable") or [])):
            how = "all" if "all" in (run.get("disable") or []) else name
            return CapabilityStatus(name, "off", f"disabled for this run (ctproxy up --disable {how}){hint}")
        then = ", then restart ctproxy" if run else ""
        return CapabilityStatus(name, "off",
                                f"{name}.enabled is false (ctproxy config set {name}.enabled true{then}){hint}")
    if not built:
        return CapabilityStatus(name, "unavailable", f"not built in this version yet ({what})")
    if name == "web_search":
        from proxy.transforms.web_search import native_status

        return CapabilityStatus(name, *native_status(config.web_search, upstream_official, upstream_trusted))
    if name == "remote_compaction":
        from proxy.windows.remote.decision import status

        rc = config.remote_compaction
        return CapabilityStatus(name, *status(rc.enabled, rc.threshold, config.recovers_overflow(), upstream_official,
                                              upstream_trusted))
    if name == "computer_use":
        state, reason = computer_use_status(config)
        if state == "active" and (held := _held_by_discovery(config, cap.tools)) is not None:
            return CapabilityStatus(name, "deferred", f"{held}; then: {reason}")  # seed 004 defect 10
        return CapabilityStatus(name, state, reason)
    if name == "shell" and (problem := _shell_problem_here(config, run)) is not None:
        return CapabilityStatus(name, "unavailable", problem)
    if name == "context":
        from proxy.windows.notes.status import context_status

        return CapabilityStatus(name, *context_status(config))
    if name in ("apply_patch", "shell") and run is not None and not run.get("workspace"):
        return CapabilityStatus(name, "unavailable", "no workspace: restart ctproxy with --workspace DIR")
    if (held := _held_by_discovery(config, cap.tools)) is not None:
        return CapabilityStatus(name, "deferred", held)
    if name == "shell":
        return CapabilityStatus(name, "active", f"{what}; {shell_sandbox(config)}")
    if name == "code_mode":
        mb = config.code_mode.memory_limit_mb
        # a worker process per cell; its RLIMIT_DATA bounds ArrayBuffers on Linux only (tools_server/codemode/worker.py)
        memory = (f"memory limit {mb} MiB each (V8 heap and ArrayBuffers, a worker process per cell)"
                  if sys.platform.startswith("linux") else
                  f"memory limit {mb} MiB of V8 heap each (ArrayBuffers are not bounded on {sys.platform})")
        return CapabilityStatus(name, "active", f"{what}, {memory}, nested apply_patch approval "
                                f"{config.code_mode.approval_mode}; remote code execution for whoever holds the "
                                "tool server's token")
    if name == "tool_discovery":
        return CapabilityStatus(name, *_discovery_status(config))
    if name == "image_generation":
        from proxy.transforms.web_search import credentials_statement

        st = CapabilityStatus(name, "active", "gpt-image-2, one image per call, saved under artifacts/; "
                              + credentials_statement(upstream_official, upstream_trusted, "images/generations"))
        return _needs_api_key(st, upstream_official, upstream_trusted, run)
    return CapabilityStatus(name, "active", what)


COMPUTER_USE_TOOLS = capability("computer_use").tools


def _held_by_discovery(config: Config, tools: tuple[str, ...]) -> str | None:
    """`deferred` (seed 004 §5.8): the capability would be active, but discovery holds back all its tools."""
    td = config.tool_discovery
    if not td.enabled or not tools or not set(tools) <= set(td.deferred):
        return None
    return f"{DEFERRED_MEANS} (tool_discovery.deferred)"


def _needs_api_key(st: CapabilityStatus, upstream_official: bool, upstream_trusted: bool,
                   run: dict | None) -> CapabilityStatus:
    """Image generation and sidecar search call OpenAI themselves. Behind an untrusted upstream no session's
    credentials may be used, so only OPENAI_API_KEY in ctproxy's environment can pay for a call: without it
    every call fails, and the capability is unavailable (and not offered), with what to do."""
    if st.state != "active" or upstream_official or upstream_trusted:
        return st
    has_key = run.get("openai_api_key") if run and "openai_api_key" in run else bool(os.environ.get("OPENAI_API_KEY"))
    if has_key:
        return st
    return CapabilityStatus(st.name, "unavailable",
                            "behind an untrusted --upstream it can only use OPENAI_API_KEY, and ctproxy's environment "
                            "has none: export OPENAI_API_KEY before `ctproxy up`, or pass --trust-upstream if that "
                            "gateway may receive the session's API key")


def _shell_problem_here(config: Config, run: dict | None) -> str | None:
    """A running tool server that answered judged its shell itself (`_as_the_server_says`): the policy and
    shell are looked up there, not here."""
    if isinstance((run or {}).get(TOOLS_HEALTH), dict) and "unavailable" in run[TOOLS_HEALTH]:
        return None
    return shell_problem(config)


def shell_problem(config: Config) -> str | None:
    """Why no shell command could run with this config (every call would fail), or None."""
    from proxy.sandbox.policy import SeamConfigError, load_hooks

    shell = config.shell.shell or os.environ.get("SHELL") or "/bin/sh"  # tools_server/shell/manager.resolve_shell
    if (shutil.which(shell) if "/" not in shell else (shell if os.access(shell, os.X_OK) else None)) is None:
        return f"shell.shell {shell!r} is not an executable here (ctproxy config set shell.shell /bin/bash)"
    try:
        load_hooks(config.shell.policy)
    except SeamConfigError as exc:
        return f"{exc} (fix shell.policy, or ctproxy config set shell.policy null)"
    except Exception as exc:  # a hook that fails while being built refuses every call too
        return f"shell.policy {config.shell.policy!r} fails when built: {type(exc).__name__}"
    return sandbox_problem(config.shell.sandbox)  # never unconfined by surprise: no sandbox, no command


def shell_sandbox(config: Config) -> str:
    """The shell line's sandbox words: `sandbox workspace-write, network off …` or `unsandboxed …`."""
    sh = config.shell
    return describe(sh.sandbox, sh.network, limits_of(sh), find_prlimit(), cgroup=pids_cgroup())


def _discovery_status(config: Config) -> tuple[str, str]:
    deferred = set(config.tool_discovery.deferred)
    group = deferred & set(COMPUTER_USE_TOOLS)
    if group and group != set(COMPUTER_USE_TOOLS):
        return "unavailable", "tool_discovery.deferred must list all six Computer Use tools or none of them"
    return "active", (f"find_tools over the tool server's registry; {len(deferred)} tool(s) held back until "
                      "loaded, per session, never persisted")


def computer_use_status(config: Config) -> tuple[str, str]:
    """What this machine lacks for Computer Use, named exactly (Debian packages, Python modules, the display,
    the session bus); `active` when nothing is missing (a private desktop or the macOS app-server starts on
    first use; `deferred` is tool discovery's word)."""

    cu = config.computer_use
    backend = cu.backend if cu.backend != "auto" else ("macos" if sys.platform == "darwin" else "linux")
    if backend == "macos":
        if sys.platform != "darwin":
            return "unavailable", ("macOS backend: macOS only (ChatGPT.app's bundled Codex app-server); "
                                   f"this is {sys.platform}")
        res = "/Applications/ChatGPT.app/Contents/Resources"
        home = os.environ.get("CODEX_HOME") or os.path.expanduser("~/.codex")
        for path in (f"{res}/codex", f"{res}/cua_node/bin/node_repl"):
            if not os.access(path, os.X_OK):
                return "unavailable", f"ChatGPT.app's bundled runtime is missing ({path})"
        if not os.path.exists(f"{home}/computer-use/Codex Computer Use.app"):
            return "unavailable", f"the Codex Computer Use helper is not installed ({home}/computer-use)"
        return "active", f"starts ChatGPT.app's app-server on first use (approval: {cu.approval_mode})"
    missing = [pkg for exe, pkg in (("xdotool", "xdotool"),) if shutil.which(exe) is None]
    display = cu.display or os.environ.get("DISPLAY")
    bus = cu.dbus_address or os.environ.get("DBUS_SESSION_BUS_ADDRESS")
    private = not display and cu.start_xvfb
    if private:
        missing += [pkg for exe, pkg in (("Xvfb", "xvfb"), ("dbus-daemon", "dbus")) if shutil.which(exe) is None]
        if not any(os.access(p, os.X_OK) for p in ("/usr/libexec/at-spi-bus-launcher",
                                                   "/usr/lib/at-spi2-core/at-spi-bus-launcher")):
            missing.append("at-spi2-core")
    modules = [mod for mod, pip in (("dbus_fast", "dbus-fast"), ("Xlib", "python-xlib"), ("mss", "mss"),
                                    ("PIL", "pillow")) if importlib.util.find_spec(mod) is None]
    problems = []
    if missing:
        problems.append(f"missing Debian packages: {', '.join(missing)} (scripts/bootstrap.sh installs them)")
    if modules:
        problems.append(f"missing Python modules: {', '.join(modules)} (pip install -e .)")
    if not display and not private:
        problems.append("no X display (set DISPLAY or computer_use.display, or computer_use.start_xvfb true)")
    elif not private and not bus:
        problems.append("no session bus for the AT-SPI bus (set DBUS_SESSION_BUS_ADDRESS or computer_use.dbus_address)")
    if problems:
        return "unavailable", "; ".join(problems)
    if private:
        return "active", ("X11 + AT-SPI on a private Xvfb desktop, started on first use "
                          f"(approval: {cu.approval_mode})")
    return "active", f"X11 + AT-SPI on display {display} (approval: {cu.approval_mode})"


def all_statuses(config: Config, run: dict | None = None, file_config: Config | None = None) -> list[CapabilityStatus]:
    """With a running proxy, route-bound capabilities are judged by its upstream; else by the default
    (official) upstream that `ctproxy up` would use. `config` is what runs; `file_config` (the file with
    this run's overrides), when given, is compared with it, capability by capability."""
    official = bool(run.get("upstream_official", True)) if run else True
    trusted = bool(run.get("upstream_trusted", False)) if run else False
    out = []
    for name in CAPABILITIES:
        st = capability_status(config, name, official, trusted, run)
        if file_config is not None and (note := _drift(config, file_config, name)):
            st = CapabilityStatus(st.name, st.state, st.reason, note)
        out.append(st)
    return out


REQUEST_STAGES = ("web_search", "context", "remote_compaction")  # the capabilities that rewrite requests


def request_changes(config: Config, run: dict | None = None) -> str:
    """One line of what this ctproxy changes in agents' requests: the banner's `requests` line."""
    official = bool(run.get("upstream_official", True)) if run else True
    trusted = bool(run.get("upstream_trusted", False)) if run else False
    parts = []
    for name in REQUEST_STAGES:
        st = capability_status(config, name, official, trusted, run)
        parts.append(f"{name} {st.state}" + (f" ({config.web_search.backend})" if name == "web_search"
                                              and st.state == "active" else ""))
    families = list(config.bridge.families)
    parts.append(f"bridge {', '.join(families)}" if families else "bridge off")
    return "; ".join(parts)


def _drift(running: Config, wanted: Config, name: str) -> str:
    now, then = getattr(running, name), getattr(wanted, name)
    if now == then:
        return ""
    if now.enabled != then.enabled:
        return f"config says {'enabled' if then.enabled else 'disabled'}; restart ctproxy to apply"
    changed = sorted(k for k in type(now).model_fields if getattr(now, k) != getattr(then, k))
    return f"config changes {', '.join(f'{name}.{k}' for k in changed)}; restart ctproxy to apply"


def other_drift(running: Config, wanted: Config) -> list[str]:
    """Settings outside the capability sections that differ between the running config and the file."""
    return sorted(k for k in type(running).model_fields  # (the store has a line of its own: store_line)
                  if k not in CAPABILITIES and k != "store" and getattr(running, k) != getattr(wanted, k))


def running_config(run: dict | None) -> Config | None:
    """The config snapshot the running ctproxy (proxy and tool server) runs on, from run.json; None for a
    run.json written by an older ctproxy."""
    data = (run or {}).get("config")
    if not isinstance(data, dict):
        return None
    try:
        return Config.model_validate(data)
    except ValidationError:
        return None


def write_run_config(state: StateDir, config: Config) -> Path:
    """The snapshot handed to the tool server (`--config`), so both processes run the same config."""
    from proxy.files import atomic_write_text
    from proxy.store.choice import public_url

    data = config.model_dump(mode="json")
    if data["store"].get("url"):  # the store's password stays out of files: the tool server gets CTPROXY_STORE
        data["store"]["url"] = public_url(data["store"]["url"])
    path = state.root / RUN_CONFIG_FILE
    atomic_write_text(path, json.dumps(data, indent=2) + "\n", mode=0o600)
    return path


def tools_answering(state: StateDir, run: dict | None, timeout: float = 3.0) -> bool | None:
    """Whether the running tool server answers /healthz (None: there is none)."""
    health = tools_health(state, run, timeout)
    return None if health is None else health is not False


def tools_health(state: StateDir, run: dict | None, timeout: float = 3.0) -> dict | bool | None:
    """The running tool server's /healthz answer (a dict), False when it does not answer, None when there is
    none."""
    url = (run or {}).get("tools")
    if not url:
        return None
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + "/healthz", headers={"Authorization": f"Bearer {state.token()}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = json.loads(resp.read() or b"{}") if resp.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return body if isinstance(body, dict) else False


def with_tools_health(state: StateDir, run: dict | None) -> tuple[dict | None, bool | None]:
    """`run` with the tool server's answer added (what `capability_status` then reports), and whether it
    answered (None: no tool server)."""
    health = tools_health(state, run)
    if run is None or health is None:
        return run, None
    return {**run, TOOLS_HEALTH: health}, health is not False


def write_desktop_file(state: StateDir, info: dict) -> None:
    from proxy.files import atomic_write_text

    atomic_write_text(state.root / DESKTOP_FILE, json.dumps(info) + "\n", mode=0o600)


def running_desktop(state: StateDir, run: dict | None) -> str | None:
    """The display of the private desktop the running tool server started, or None."""
    if not run or not run.get("tools_pid"):
        return None
    try:
        info = json.loads((state.root / DESKTOP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(info.get("display")) if info.get("pid") == run["tools_pid"] else None


def with_running_desktop(statuses: list[CapabilityStatus], state: StateDir,
                         run: dict | None) -> list[CapabilityStatus]:
    """Computer Use's line names the private desktop once the running tool server has started it."""
    display = running_desktop(state, run)
    if display is None:
        return statuses
    return [CapabilityStatus(s.name, s.state, f"{s.reason}; private desktop running on display {display}", s.pending)
            if s.name == "computer_use" else s for s in statuses]


def write_run_file(state: StateDir, info: dict) -> None:
    from proxy.files import atomic_write_text

    atomic_write_text(state.root / RUN_FILE, json.dumps(info, indent=2) + "\n", mode=0o600)


def read_run_file(state: StateDir) -> dict | None:
    path = state.root / RUN_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    pid = info.get("pid")
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return None  # a stale file from a proxy that is gone
    return info


def render(config: Config, state: StateDir, config_path: Path, run: dict | None = None,
           file_config: Config | None = None, answering: bool | None = None,
           reachable: tuple[bool, str] | None = None) -> str:
    lines = [f"state dir: {state.root}", f"config:    {config_path}" + ("" if config_path.exists() else " (defaults)")]
    if run:
        overrides = [f"+{n}" for n in run.get("enable") or []] + [f"-{n}" for n in run.get("disable") or []]
        if overrides:
            lines.append(f"this run:  {' '.join(overrides)} (ctproxy up --enable/--disable)")
        lines.append(f"proxy:     running (pid {run['pid']}) on {run['proxy']} mode={run['mode']}")
        if workers := run.get("workers"):
            lines.append(f"workers:   {len(workers)} on one listen address: " + ", ".join(
                f"worker {w.get('index')} pid {w.get('pid')}"
                + (f" (restarted {w['restarts']}×)" if w.get("restarts") else "") for w in workers))
        lines.append(f"upstream:  {run['upstream']}")
        if run.get("upstream_ca"):
            lines.append(f"upstream CA: {run['upstream_ca']} (trusted besides the system store)")
        if run.get("tools"):
            health = {True: "answering", False: "not answering (restart ctproxy)", None: ""}[answering]
            lines.append(f"tools:     {run['tools']}" + (f"  {health}" if health else ""))
        if (ws := websocket_line(run)) is not None:
            lines.append(f"websocket: {ws}")
        if (st := store_line(run, reachable)) is not None:
            lines.append(f"store:     {st}")
        if file_config is not None and (others := other_drift(config, file_config)):
            lines.append(f"pending:   config changes {', '.join(others)}; restart ctproxy to apply")
    else:
        lines.append("proxy:     not running (start it with `ctproxy up`)")
    lines.append("")
    width = max(len(n) for n in CAPABILITIES)
    for st in with_running_desktop(all_statuses(config, run, file_config), state, run):
        note = f"  ({st.pending})" if st.pending else ""
        lines.append(f"  {st.name:<{width}}  {st.state:<11}  {st.reason}{note}")
    from proxy.bridge.status import render_lines

    lines += render_lines(bridge_report(config, run, state), config.bridge.max_rounds)
    return "\n".join(lines)


def store_line(run: dict | None, reachable: tuple[bool, str] | None) -> str | None:
    """Which store the running proxy serves from (run.json: `embedded` or the URL without its password), where the
    choice came from, and whether it answers now (`store_reachable`)."""
    info = run.get("store") if run else None
    if not isinstance(info, dict):
        return None
    line = f"{info.get('url')} (from {info.get('source')})"
    if reachable is not None:
        ok, why = reachable
        line += "  reachable" if ok else f"  NOT reachable: {why}"
    return line


def store_reachable(run: dict | None, config_url: str | None = None) -> tuple[bool, str] | None:
    """Whether the running proxy's store answers now. The URL in run.json has no password: libpq finds it where
    ctproxy's own processes would (CTPROXY_STORE or store.url of this environment, PGPASSWORD, ~/.pgpass)."""
    info = run.get("store") if run else None
    if not isinstance(info, dict):
        return None
    if info.get("kind") != "postgresql":
        return True, "the state directory's database"
    from proxy.store.choice import StoreChoice, public_url, reachable

    url = str(info.get("url"))
    for candidate in (os.environ.get("CTPROXY_STORE"), config_url):
        if candidate and public_url(candidate) == url:  # the same database, with its password if one is known
            url = candidate
            break
    return reachable(StoreChoice(url, str(info.get("source"))))


def websocket_line(run: dict | None) -> str | None:
    """What the running proxy does with a client's Responses WebSocket (`GET …/responses`, Upgrade), as the
    launcher recorded it (run.json); None for a run file that does not say."""
    ws = run.get("websocket") if run else None
    if not isinstance(ws, dict):
        return None
    where = "wss://…/responses through HTTPS_PROXY" if run.get("mode") == "regular" else f"{run['proxy']}/v1/responses"
    if not ws.get("adapter"):
        return f"relayed untouched ({where}): no stage sees its creates (the ctp_ws option is off)"
    size = int(ws.get("max_message_bytes") or 0)
    limit = f"{size // (1 << 20)} MiB" if size % (1 << 20) == 0 else f"{size} bytes"
    relay = "raw relay on" if ws.get("raw_relay") else "raw relay off: mitmproxy parses each message"
    return (f"handled ({where}): each response.create runs through the chain; max message {limit} "
            f"(decompressed, websocket.max_message_bytes), {relay}")


def bridge_report(config: Config, run: dict | None = None, state: StateDir | None = None) -> list:
    """The tool bridge, family by family: bridged or not, and why (proxy/bridge/status.py); with the state
    directory of a running proxy, also which bridged tools agents' own tools displaced."""
    from proxy.bridge.server import SEEN_FILE
    from proxy.bridge.status import bridge_statuses, read_seen

    official = bool(run.get("upstream_official", True)) if run else True
    trusted = bool(run.get("upstream_trusted", False)) if run else False

    def state_of(name: str) -> tuple[str, str]:
        st = capability_status(config, name, official, trusted, run)
        return st.state, st.reason

    return bridge_statuses(config, run, state_of, read_seen(state.root / SEEN_FILE, run) if state else None)
