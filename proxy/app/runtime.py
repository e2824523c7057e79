"""Process-wide runtime for addons: config, state directory and upstream, from mitmproxy options.

Every addon declares the same `ctp_*` options (identical declarations are merged by mitmproxy), so
each module also works alone under `mitmdump -s`. The runtime is rebuilt when an option changes.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.config import Config, config_path_from_env, load_config, with_overrides
from proxy.routes import Upstream, parse_upstream
from proxy.state import StateDir
from proxy.store.embedded import EmbeddedStore
from proxy.store.interface import Store
from proxy.usage import UsageCache
from proxy.windows.notes.last_tools import LastTools

if TYPE_CHECKING:
    from proxy.bridge.server import BridgeService
    from proxy.dbworker import DBWorker
    from proxy.journal import Journal
    from proxy.store.choice import StoreChoice
    from proxy.upstream import UpstreamTurns
    from proxy.windows.remote.store import SessionMemo

log = logging.getLogger("ctproxy")

OPTION_NAMES = ("ctp_state_dir", "ctp_config", "ctp_upstream", "ctp_trust_upstream", "ctp_enable", "ctp_disable")


def declare_options(loader: Any) -> None:
    loader.add_option("ctp_state_dir", str, "", "ctproxy state directory (default: $CTPROXY_HOME)")
    loader.add_option("ctp_config", str, "", "ctproxy config file (default: <state dir>/config.json)")
    loader.add_option("ctp_upstream", str, "", "upstream origin for reverse mode; empty = official OpenAI endpoints")
    loader.add_option("ctp_trust_upstream", bool, False, "forward credentials to a non-official upstream")
    loader.add_option("ctp_enable", Sequence[str], [], "capabilities to enable for this run")
    loader.add_option("ctp_disable", Sequence[str], [], "capabilities to disable for this run")


@dataclass
class Services:
    """What the stages of one process share, one typed field each (made on first use by the stage
    that owns it; kept across a runtime rebuild for the same state directory)."""

    journal: Journal | None = None  # history: the process's journal
    response_aliases: Mapping[str, str] | None = None  # history: response id → session key, for session_of
    usage: UsageCache = field(default_factory=UsageCache)  # tap: each session's newest usage
    db: DBWorker | None = None  # the one state-database worker (proxy/dbworker.py)
    upstream: UpstreamTurns | None = None  # the upstream-turn service (proxy/upstream): ctproxy's own calls
    bridge: BridgeService | None = None  # bridge: its loopback endpoint, tool-server client and memory
    compaction_memo: SessionMemo | None = None  # compaction: what this process last wrote per session
    compaction_key: bytes | None = None  # compaction: the per-installation account HMAC key
    # compaction: the windows learned from upstreams, (model, endpoint) → (window or None, when it was read:
    # time.monotonic()); read again from the store after LEARNED_WINDOW_FRESH_S (proxy/windows/compacting.py)
    compaction_windows: dict[tuple[str, str], tuple[int | None, float]] = field(default_factory=dict)
    store: Store | None = None  # the state store (proxy/store/interface.py): notes read at a window's opening
    store_choice: StoreChoice | None = None  # which store `ctproxy up` chose (None: the embedded default)
    last_tools: LastTools = field(default_factory=LastTools)  # body writer: each session's forwarded tools (issue 47)


@dataclass
class Runtime:
    config: Config
    state: StateDir
    upstream: Upstream
    services: Services

    def state_store(self) -> Store:
        """The process's state store: the one the launcher opened (`use_store`: `--store`, CTPROXY_STORE,
        store.url), else the embedded store of `state` (SQLite and note files), made on first use."""
        if self.services.store is None:
            self.services.store = EmbeddedStore(self.state)
        return self.services.store

    def use_store(self, store: Store, choice: StoreChoice | None = None) -> None:
        """Serve from `store` (opened and migrated by the launcher, closed by it). A store other than the embedded
        one is shared with other processes and machines: the usage cache then also reads the session's stored
        usage (another instance may have seen its last answer)."""
        self.services.store = store
        self.services.store_choice = choice
        if store.kind != "embedded":
            self.services.usage.backend = store.usage


_current: Runtime | None = None
_key: tuple | None = None
_pinned = False
_bound: Any = None  # the options object _current was built from, until one of its ctp_ options changes
_subscribed: list[weakref.ref[Any]] = []  # options objects we listen to (Options is not hashable)
_stages: weakref.WeakSet[Any] = weakref.WeakSet()  # stages holding a runtime (addons/_stage.Stage)


def _options_key(opts: Any) -> tuple:
    return tuple(
        tuple(v) if isinstance(v := getattr(opts, n, None), list | tuple) else v for n in OPTION_NAMES
    )


def invalidate(updated: set[str] | None = None, **_: Any) -> None:
    """A ctp_ option changed: the next `current()` re-reads the options. Stages call it from `configure`,
    which mitmproxy may run before this module's own listener on the options."""
    global _bound
    if updated is None or any(name in OPTION_NAMES for name in updated):
        _bound = None


def current() -> Runtime:
    """The runtime for the current mitmproxy options (built on first use, rebuilt when a ctp_ option
    changes). Cheap on the hot path: reading options costs far more than one identity check."""
    global _current, _key, _bound
    if _pinned and _current is not None:
        return _current
    from mitmproxy import ctx

    opts = ctx.options
    if _current is not None and _bound is opts:
        return _current
    key = _options_key(opts)
    if _current is None or key != _key:
        _current = build(
            state_dir=getattr(opts, "ctp_state_dir", "") or None,
            config_file=getattr(opts, "ctp_config", "") or None,
            upstream=getattr(opts, "ctp_upstream", "") or None,
            trust_upstream=bool(getattr(opts, "ctp_trust_upstream", False)),
            enable=list(getattr(opts, "ctp_enable", []) or []),
            disable=list(getattr(opts, "ctp_disable", []) or []),
            previous=_current,
        )
        _key = key
    if not any(ref() is opts for ref in _subscribed):
        opts.changed.connect(invalidate)
        _subscribed[:] = [ref for ref in _subscribed if ref() is not None] + [weakref.ref(opts)]
    _bound = opts
    return _current


def build(state_dir: str | None = None, config_file: str | None = None, upstream: str | None = None,
          trust_upstream: bool = False, enable: list[str] | None = None, disable: list[str] | None = None,
          previous: Runtime | None = None) -> Runtime:
    state = StateDir.open(Path(state_dir) if state_dir else None)
    config = load_config(config_path_from_env(state.root, Path(config_file) if config_file else None))
    config = with_overrides(config, enable or [], disable or [])
    if previous is not None and previous.state == state:
        services = previous.services
    else:
        from proxy import workerid

        # A worker of `--workers N`: the usage of a session's last answer may be another worker's (proxy/usage.py).
        services = Services(usage=UsageCache(db_path=state.db_path if workerid.shared_sessions() else None))
    return Runtime(config, state, parse_upstream(upstream, trust_upstream), services)


def bind(stage: Any) -> None:
    """`stage` keeps the runtime on itself (addons/_stage.Stage); it is told to drop it when the runtime
    is replaced explicitly."""
    _stages.add(stage)


def _unbind_stages() -> None:
    for stage in list(_stages):
        stage.unbind()


def install(rt: Runtime) -> None:
    """Used by tests and the launcher to set the runtime explicitly."""
    global _current, _key, _pinned
    _current, _key, _pinned = rt, None, True
    _unbind_stages()


def uninstall() -> None:
    global _current, _key, _pinned, _bound
    _current, _key, _pinned, _bound = None, None, False, None
    _unbind_stages()
