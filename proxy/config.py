"""The one configuration model: every capability's switch with the seeds' defaults.

`config.json` in the state directory is optional; unknown keys are an error that names the key.
Dotted keys (`web_search.backend`) address fields for `ctproxy config get/set`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from proxy.capabilities import NAMES
from proxy.errors import CtproxyError

CAPABILITIES: tuple[str, ...] = NAMES  # the capability table's names: each is a section below


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class WebSearchConfig(_Section):
    """One capability, two paths (seed 004 §5.1): `native` injects the hosted tool into the agent's request;
    `sidecar` exposes the `openai_web_search` tool, run by its own executor model. `auto` decides before the
    request: native on an eligible route, else the sidecar when an executor is configured; never a fallback
    after an error, and at most one path per turn. On by default (`auto`): docs/pipeline.md makes the case and says
    what it costs (seed 004 pipeline defect 3 stays open)."""

    enabled: bool = True
    backend: Literal["off", "auto", "native", "sidecar"] = "auto"
    mode: Literal["live", "cached"] = "live"
    context_size: Literal["low", "medium", "high"] | None = None
    max_input_tokens: int = Field(128_000, ge=1)
    sidecar_model: str | None = Field(None, min_length=1, description="the sidecar's executor model (an official "
                                      "OpenAI/Codex Responses model); unset: no sidecar")
    sidecar_effort: Literal["auto", "none", "minimal", "low", "medium", "high", "xhigh"] = Field(
        "auto", description="the executor's reasoning effort, independent of the agent's ('auto': not sent)")

    # The running proxy's upstream, as the tool server was told (`--upstream-eligible`): True when official or
    # trusted (native search there). None: not known (a tool server on its own). Not part of the file.
    _upstream_eligible: bool | None = PrivateAttr(None)

    def for_upstream(self, eligible: bool | None) -> None:
        self._upstream_eligible = eligible

    def sidecar_exposed(self, route_eligible: bool | None = None) -> bool:
        """Whether the `openai_web_search` tool is offered: backend `sidecar` with an executor (without
        `sidecar_model` status says unavailable), or `auto` with an executor configured, except toward an
        upstream where `auto` searches natively (an official or trusted one, issue 31 / defect 7: one search
        path, and the native one there). `route_eligible`: that upstream's eligibility, if not the one this
        config was told (`for_upstream`)."""
        if route_eligible is None:
            route_eligible = self._upstream_eligible
        # Without an executor every call would fail: status says unavailable, and nothing offers it (issue 27).
        return self.enabled and self.sidecar_model is not None and (
            self.backend == "sidecar" or (self.backend == "auto" and route_eligible is not True))


class RemoteCompactionConfig(_Section):
    enabled: bool = False
    threshold: float = Field(0.8, gt=0, le=1)
    recover_overflow: bool = Field(True, description="on context_length_exceeded: compact, retry once")
    custom_instructions: str | None = Field(None, description="custom compaction instructions: readable fallback")
    timeout_seconds: float = Field(120.0, gt=0, description="one remote compaction call")


class ContextConfig(_Section):
    """Context windows (seed 000, issue 13; docs/context.md): get_context_remaining, new_context, the
    reminder and hard-trigger ratios of the window, the strategy of a threshold rollover, and the
    `[id: …]` projection. The seed names a reminder and a hard trigger without numbers: these are ours."""

    enabled: bool = True
    reminder_ratio: float = Field(0.7, gt=0, le=1, description="share of the window at which a hidden reminder "
                                                               "asks for a checkpoint note and new_context")
    hard_ratio: float = Field(0.85, gt=0, le=1, description="share of the window at which the proxy runs the "
                                                           "checkpoint turn before forwarding")
    strategy: Literal["notes", "remote", "fallback"] = Field(
        "notes", description="how the hard trigger makes a new window: notes checkpoint, remote compaction, "
                             "or the readable fallback")
    id_projection: bool = Field(True, description="mark recoverable items with their journal id ([id: …]) on "
                                                  "the forwarded copy")
    checkpoint_instruction: str | None = Field(None, description="replaces the checkpoint turn's instruction")
    checkpoint_timeout_seconds: float = Field(120.0, gt=0, description="the checkpoint turn's upstream answer, "
                                                                      "and its note write; past it the turn has "
                                                                      "failed (compaction instead)")

    @model_validator(mode="after")
    def _ratios_in_order(self) -> ContextConfig:
        if self.reminder_ratio > self.hard_ratio:
            raise ValueError("context.reminder_ratio must not be above context.hard_ratio")
        return self


class PromptCacheConfig(_Section):
    """The upstream's prompt cache (issue 47, docs/prompt-cache.md): a derived `prompt_cache_key` for sessions whose
    client sends none, and the new window's prefix pre-warmed after a rollover or compaction."""

    derive_key: bool = Field(True, description="give a session whose client sends no prompt_cache_key a stable one")
    prewarm: bool = Field(True, description="after a rollover or compaction, pre-warm the new window's prefix "
                                            "(prompt_cache_options.prewarm) on models that support it")


class HistoryConfig(_Section):
    enabled: bool = True
    max_tool_output_chars: int = Field(12_000, ge=500, description="cap of one history tool answer")
    cache_mb: int = Field(128, ge=1, description="memory the journal's caches of sessions and resent inputs may "
                                                 "hold in the proxy (least recently used dropped first)")


class NotesConfig(_Section):
    enabled: bool = True
    max_tool_output_chars: int = Field(12_000, ge=500, description="cap of one notes tool answer")


class ApplyPatchConfig(_Section):
    enabled: bool = False


class ShellConfig(_Section):
    enabled: bool = False
    shell: str | None = None
    policy: str | None = Field(None, description="dotted path to a policy/context hook object")
    max_jobs: int = Field(16, ge=1, le=256, description="unsettled commands per (task, agent)")
    max_poll_ms: int = Field(300_000, ge=5_000, description="longest empty write_stdin poll")
    kill_after_ms: int = Field(5_000, ge=0, description="SIGTERM to SIGKILL grace when stopping")
    sandbox: Literal["workspace-write", "read-only", "danger-full-access"] = Field(
        "workspace-write", description="bubblewrap around every command (proxy/sandbox/bwrap.py): workspace-write (the "
                                       "workspace and a private /tmp writable, .git read-only), read-only, or "
                                       "danger-full-access (unsandboxed)")
    network: bool = Field(False, description="a sandboxed command may use the network (false: its own empty "
                                             "network namespace)")
    cpu_limit_s: int = Field(3_600, ge=0, description="CPU seconds per process of a job (0: none)")
    memory_limit_mb: int = Field(16_384, ge=0, description="address space per process of a job, MiB (0: none)")
    max_processes: int = Field(512, ge=0, description="processes of a job (RLIMIT_NPROC; 0: none)")


class CodeModeConfig(_Section):
    """Code mode (docs/code_mode.md): JavaScript cells in V8 isolates that call the shell, patch, history and
    notes tools. Remote code execution for whoever holds the tool server's token, like shell."""

    enabled: bool = False
    memory_limit_mb: int = Field(64, ge=8, le=4096, description="hard memory limit of one cell's V8 isolate")
    approval_mode: Literal["confirm", "always"] = Field(
        "confirm", description="confirm: a nested apply_patch needs a person's confirmation (refused with "
                               "approval-unavailable where nobody can be asked); always: no extra confirmation")


class ImageGenerationConfig(_Section):
    enabled: bool = False


class SidecarSearchConfig(_Section):
    """Folded into `web_search.backend` (issue 15): `enabled` is not stored but read from the web_search
    section (`sidecar_exposed()`: backend sidecar or auto, with a `sidecar_model`); setting it sets the backend.
    An old file's `sidecar_search.enabled: true` reads as backend `sidecar`."""

    _web: WebSearchConfig | None = PrivateAttr(None)  # the same Config's web_search (linked by Config)

    @property
    def enabled(self) -> bool:
        return self._web is not None and self._web.sidecar_exposed()

    def __eq__(self, other: object) -> bool:  # no fields of its own; the link is not part of its value
        return isinstance(other, SidecarSearchConfig)

    __hash__ = None  # type: ignore[assignment]

    @enabled.setter
    def enabled(self, value: bool) -> None:
        if self._web is None:
            return
        if value:  # turning the sidecar on turns web search on (it may have been turned off)
            self._web.backend, self._web.enabled = "sidecar", True
        elif self._web.backend in ("sidecar", "auto"):
            self._web.backend = "native" if self._web.backend == "auto" else "off"


class ToolDiscoveryConfig(_Section):
    """find_tools (docs/code_mode.md, "Tool discovery"): the tools named in `deferred` are held back from bridged
    requests until the model loads them; the six Computer Use tools are listed all or none."""

    enabled: bool = False
    deferred: list[str] = Field(
        default_factory=lambda: ["openai_generate_image", "computer_use_list_apps", "computer_use_get_app_state",
                                 "computer_use_click", "computer_use_type_text", "computer_use_press_key",
                                 "computer_use_scroll"],
        description="tool names held back until find_tools loads them")

    @field_validator("deferred")
    @classmethod
    def _computer_use_all_or_none(cls, names: list[str]) -> list[str]:
        group = {n for n in names if n.startswith("computer_use_")}
        if group and len(group) != 6:
            raise ValueError("list all six computer_use_* tools or none of them (they load together)")
        if "find_tools" in names:
            raise ValueError("find_tools itself cannot be deferred")
        return names


class ComputerUseConfig(_Section):
    """Computer Use (docs/computer_use.md): Linux X11 + AT-SPI, or macOS through ChatGPT.app's app-server."""

    enabled: bool = False
    approval_mode: Literal["confirm", "always"] = Field(
        "confirm", description="confirm: ask once per app per caller (MCP session, else task and agent) for the "
                    "tool-server run (MCP elicitation); always: never ask")
    backend: Literal["auto", "linux", "macos"] = Field("auto", description="auto: macos on macOS, else linux")
    display: str | None = Field(None, description="X display to drive (null: $DISPLAY)")
    dbus_address: str | None = Field(None, description="session bus of that desktop (null: $DBUS_SESSION_BUS_ADDRESS)")
    start_xvfb: bool = Field(False, description="with no display: start a private Xvfb desktop (session bus, "
                                                "AT-SPI bus, a window manager when installed)")
    xvfb_screen: str = Field("1280x800x24", pattern=r"^\d{3,5}x\d{3,5}x(8|16|24)$")


BRIDGEABLE: tuple[str, ...] = ("history", "notes", "context", "apply_patch", "shell", "code_mode", "image_generation",
                                "sidecar_search", "tool_discovery", "computer_use")  # capabilities with tools


class BridgeConfig(_Section):
    """The tool bridge (docs/bridge.md): the tool families whose tools the proxy offers to every agent and runs
    itself. Off (no family) by default: requests are then forwarded byte for byte as they came."""

    families: list[str] = Field(default_factory=list, description="capabilities whose tools are bridged, e.g. "
                                "[\"history\", \"notes\", \"context\"]")
    max_rounds: int = Field(8, ge=1, le=64, description="rounds of bridged calls one agent request may run")
    apply_patch_form: Literal["auto", "function", "custom"] = Field(
        "auto", description="apply_patch as a function or the Lark custom tool; auto: custom for GPT-5 models")

    @field_validator("families")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        unknown = [v for v in value if v not in BRIDGEABLE]
        if unknown:
            raise ValueError(f"unknown family {', '.join(map(repr, unknown))}; choose from {', '.join(BRIDGEABLE)}")
        return list(dict.fromkeys(value))


class LimitsConfig(_Section):
    """What one request may cost the proxy (docs/pipeline.md, "Limits")."""

    max_body_bytes: int = Field(
        64 * 1024 * 1024, ge=1024,
        description="largest (decoded) request body ctproxy reads: a larger plain body passes through untouched "
                    "with the features skipped; a compressed body that inflates past it is refused with a 413")


class WebSocketConfig(_Section):
    """The Responses WebSocket adapter (docs/websocket.md, ADR 0009)."""

    max_message_bytes: int = Field(
        256 * 1024 * 1024, ge=1024,
        description="largest Responses WebSocket message, decompressed, either way (Codex sends a whole request "
                    "as one message); a larger one gets the client a 1009 close and ends the socket")
    raw_relay: bool = Field(
        True, description="mitmproxy relays the client's socket to the adapter as raw bytes (fast; compression "
                          "and the size bound are the adapter's); false: as WebSocket messages (mitmproxy parses, "
                          "inflates and re-frames each one, and its inflation is not bounded)")


class TimeoutsConfig(_Section):
    """Upstream timeouts for the agent's own requests (docs/pipeline.md, "Timeouts"); null turns one off."""

    connect_seconds: float | None = Field(15.0, gt=0, description="TCP + TLS connect to the upstream")
    stream_idle_seconds: float | None = Field(
        300.0, gt=0, description="longest silence of the upstream while an answer is awaited or streamed "
                                 "(Codex's stream_idle_timeout default)")


class UpstreamConfig(_Section):
    """How ctproxy reaches its upstream (docs/official-route.md, "Behind a corporate proxy")."""

    ca_file: str | None = Field(
        None, description="PEM file of extra certificate authorities trusted for every upstream TLS connection "
                          "(mitmproxy's, ctproxy's own calls, the tool server's), added to the system's store; "
                          "`ctproxy up --upstream-ca FILE` sets it for one run")


class ProxyConfig(_Section):
    """The proxy processes (docs/adr/0012-proxy-workers.md)."""

    workers: int | Literal["auto"] = Field(
        1, description="proxy worker processes serving the one listen address (Linux: SO_REUSEPORT); "
                       "'auto': one per CPU core. One tool server and one state either way")

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 64:
            raise ValueError("workers is 1..64 or 'auto'")
        return value

    def worker_count(self) -> int:
        """How many workers `ctproxy up` starts (`auto`: the CPU cores this process may use)."""
        if self.workers == "auto":
            try:
                return max(1, min(64, len(os.sched_getaffinity(0))))
            except (AttributeError, OSError):
                return max(1, min(64, os.cpu_count() or 1))
        return int(self.workers)


class StoreConfig(_Section):
    """Where the state lives (docs/adr/0013-one-store-interface.md): `--store` and `CTPROXY_STORE` override it."""

    url: str | None = Field(
        None, description="postgresql://USER@HOST:PORT/DB: several `ctproxy up` share the notes, rollovers and "
                          "usage in that database (a password is better kept in PGPASSWORD or ~/.pgpass); "
                          "unset or 'embedded': the state directory's own store")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if value in ("", "embedded"):
            return None if value == "" else value
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("expected postgresql://USER@HOST:PORT/DB or 'embedded'")
        return value


class Config(_Section):
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    web_search: WebSearchConfig = Field(default_factory=WebSearchConfig)
    remote_compaction: RemoteCompactionConfig = Field(default_factory=RemoteCompactionConfig)
    context: ContextConfig = Field(default_factory=ContextConfig)
    prompt_cache: PromptCacheConfig = Field(default_factory=PromptCacheConfig)
    history: HistoryConfig = Field(default_factory=HistoryConfig)
    notes: NotesConfig = Field(default_factory=NotesConfig)
    apply_patch: ApplyPatchConfig = Field(default_factory=ApplyPatchConfig)
    shell: ShellConfig = Field(default_factory=ShellConfig)
    code_mode: CodeModeConfig = Field(default_factory=CodeModeConfig)
    image_generation: ImageGenerationConfig = Field(default_factory=ImageGenerationConfig)
    sidecar_search: SidecarSearchConfig = Field(default_factory=SidecarSearchConfig)
    tool_discovery: ToolDiscoveryConfig = Field(default_factory=ToolDiscoveryConfig)
    computer_use: ComputerUseConfig = Field(default_factory=ComputerUseConfig)
    bridge: BridgeConfig = Field(default_factory=BridgeConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    websocket: WebSocketConfig = Field(default_factory=WebSocketConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    model_windows: dict[str, int] = Field(
        default_factory=lambda: dict(DEFAULT_MODEL_WINDOWS),
        description="context window in tokens per model name glob; the most specific match wins "
                    "(an exact name, then the glob with the most literal characters; '*' last)",
    )
    debug: bool = False

    def enabled(self, capability: str) -> bool:
        return bool(getattr(self, capability).enabled)

    def recovers_overflow(self) -> bool:
        """Overflow recovery (compact and retry once on `context_length_exceeded`) is part of context
        management: it acts only while `remote_compaction.recover_overflow` is on AND one of the two
        capabilities that manage windows is on (`remote_compaction` or `context`). With both off the
        upstream's error reaches the agent unchanged (docs/adr/0011-window-service.md)."""
        rc = self.remote_compaction
        return rc.recover_overflow and (rc.enabled or self.context.enabled)

    @model_validator(mode="after")
    def _link_sidecar(self) -> Config:
        self.sidecar_search._web = self.web_search
        return self

    @model_validator(mode="before")
    @classmethod
    def _fold_sidecar_switch(cls, data: Any) -> Any:
        """`sidecar_search.enabled` (before issue 15) → `web_search.backend`."""
        if isinstance(data, dict) and isinstance(side := data.get("sidecar_search"), dict) and "enabled" in side:
            data = {**data, "sidecar_search": {k: v for k, v in side.items() if k != "enabled"}}
            ws = dict(data.get("web_search") or {})
            if side["enabled"] is True and "backend" not in ws:
                ws["backend"] = "sidecar"
                ws.setdefault("enabled", True)
            data["web_search"] = ws
        return data


# Context windows of current OpenAI models (tokens). Globs; more specific first.
DEFAULT_MODEL_WINDOWS: dict[str, int] = {
    "gpt-5*-codex-mini*": 272_000,
    "gpt-5*": 272_000,
    "gpt-4.1*": 1_047_576,
    "o3*": 200_000,
    "o4-mini*": 200_000,
    "gpt-4o*": 128_000,
    "*": 128_000,
}


class ConfigError(CtproxyError, ValueError):
    """A configuration problem, worded for the user."""


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(root)"
        if e["type"] == "extra_forbidden":
            parts.append(f"unknown key '{key}'")
        else:
            parts.append(f"'{key}': {e['msg']}")
    return "; ".join(parts)


def load_config(path: Path | None) -> Config:
    """Load the config file if it exists; defaults otherwise."""
    if path is None or not path.exists():
        return Config()
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_describe(exc)}") from exc


def save_config(config: Config, path: Path) -> None:
    """Write only the values that differ from the defaults, atomically."""
    from proxy.files import atomic_write_text

    data = config.model_dump(mode="json", exclude_defaults=True)
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=0o600)


def get_key(config: Config, key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if isinstance(node, BaseModel) and (part in type(node).model_fields
                                            or isinstance(getattr(type(node), part, None), property)):
            node = getattr(node, part)  # a property: sidecar_search.enabled, read from web_search
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise ConfigError(f"unknown key '{key}' (see `ctproxy config show` for the keys)")
    return node.model_dump(mode="json") if isinstance(node, BaseModel) else node


def set_key(config: Config, key: str, raw: str) -> Config:
    """Return a new config with `key` set; `raw` is parsed as JSON, else taken as a string."""
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    if key == "sidecar_search.enabled":  # folded into web_search.backend (SidecarSearchConfig)
        if not isinstance(value, bool):
            raise ConfigError(f"'{key}': expected true or false")
        new = config.model_copy(deep=True)
        new.sidecar_search.enabled = value
        return new
    data = config.model_dump(mode="json")
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node, dict) or part not in node or not isinstance(node[part], dict):
            raise ConfigError(f"unknown key '{key}' (see `ctproxy config show` for the keys)")
        node = node[part]
    if parts[-1] not in node and parts[0] != "model_windows":
        raise ConfigError(f"unknown key '{key}' (see `ctproxy config show` for the keys)")
    node[parts[-1]] = value
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from exc


ALL_CAPABILITIES = "all"  # `--disable all`: a plain pass-through proxy


def with_overrides(config: Config, enable: list[str], disable: list[str]) -> Config:
    """`--enable` / `--disable` for one run. Disabling remote_compaction turns off the whole capability,
    overflow recovery included; `--disable all` turns off every capability."""
    if ALL_CAPABILITIES in disable:
        disable = list(CAPABILITIES)
    for name in [*enable, *disable]:
        if name not in CAPABILITIES:
            raise ConfigError(f"unknown capability '{name}'; choose from: {', '.join(CAPABILITIES)}")
    for name in enable:
        config = set_key(config, f"{name}.enabled", "true")
    for name in disable:
        config = set_key(config, f"{name}.enabled", "false")
        if name == "remote_compaction":
            config = set_key(config, "remote_compaction.recover_overflow", "false")
    return config


def with_run_flags(config: Config, *, debug: bool = False, bridge: list[str] | None = None,
                   sandbox: str | None = None, workers: int | str | None = None,
                   upstream_ca: str | None = None) -> Config:
    """`ctproxy up --debug`, `--bridge FAMILY`, `--sandbox MODE`, `--workers N` and `--upstream-ca FILE` for one
    run, applied in place (the model validates the assignment). `ctproxy up` and `ctproxy status` both apply them,
    so a flag is never a pending change."""
    config.debug = config.debug or debug
    if bridge is not None:
        config.bridge.families = list(bridge)
    if sandbox is not None:
        config.shell.sandbox = sandbox  # type: ignore[assignment]
    if workers is not None:
        config.proxy.workers = workers  # type: ignore[assignment]
    if upstream_ca is not None:
        config.upstream.ca_file = upstream_ca
    return config


def config_path_from_env(state_dir: Path, explicit: Path | None = None) -> Path:
    if explicit is not None:
        return explicit
    if env := os.environ.get("CTPROXY_CONFIG"):
        return Path(env).expanduser()
    return state_dir / "config.json"
