"""What the window feature reads of the process (ADR 0014): the configuration, the state directory, the shared
services and the state store. The process's runtime (proxy/app/runtime.py) is one; the window feature is handed
it and never imports it, so the floors above it (the app, the hosts of the flow) stay above it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from proxy.config import Config
    from proxy.dbworker import DBWorker
    from proxy.journal import Journal
    from proxy.state import StateDir
    from proxy.upstream import UpstreamTurns
    from proxy.usage import UsageCache
    from proxy.windows.ports import WindowStore
    from proxy.windows.remote.store import SessionMemo


class WindowServices(Protocol):
    """The process's shared services the window feature uses (one typed field each, made on first use)."""

    journal: Journal | None
    usage: UsageCache
    db: DBWorker | None
    upstream: UpstreamTurns | None
    bridge: Any  # the bridge's service (proxy/bridge/server.py), which knows a bridged turn's executed calls
    compaction_memo: SessionMemo | None
    compaction_key: bytes | None
    compaction_windows: dict[tuple[str, str], tuple[int | None, float]]


class WindowHost(Protocol):
    """The process as the window feature sees it."""

    config: Config
    state: StateDir
    services: WindowServices

    def state_store(self) -> WindowStore: ...
