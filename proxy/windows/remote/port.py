"""The port the stores implement for compaction's records (ADR 0013, ADR 0014)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from proxy.state import StoreKind
from proxy.windows.remote.store import Event as CompactionEvent
from proxy.windows.remote.store import SessionRecord


@runtime_checkable
class CompactionBackend(Protocol):
    """Compaction's own records (proxy/windows/remote/store.py): per session what the last request forwarded, a
    pending forced compaction, a failed remote attempt and the agent items at the last compaction; the
    compaction / recovery / projection events; the effective window an upstream showed per model and endpoint.

    Contract (both implementations, tests/proxy/store/test_store_interface.py):
    - `record_forwarded` replaces the session's last request and clears a forced compaction;
      `mark_force_compact` and `mark_failed` keep what was forwarded; `session_state` is None for a session
      nothing was recorded for, and carries `compacted_items` once `record_compacted` ran (even alone);
    - `events` are oldest first, the newest `limit` of them, per session or over all sessions;
    - `learn_window` keeps the smallest window seen for (model, endpoint)."""

    kind: StoreKind

    def session_state(self, session_key: str) -> SessionRecord | None: ...

    def record_forwarded(self, session_key: str, checkpoint_id: str | None, client_items: int,
                         sent_bytes: int) -> None: ...

    def mark_force_compact(self, session_key: str) -> None: ...

    def mark_failed(self, session_key: str, client_items: int) -> None: ...

    def record_compacted(self, session_key: str, client_items: int) -> None: ...

    def record_event(self, session_key: str, kind: str, outcome: str, reason: str | None = None,
                     checkpoint_id: str | None = None) -> None: ...

    def events(self, session_key: str | None = None, limit: int = 200) -> list[CompactionEvent]: ...

    def learn_window(self, model: str, endpoint: str, window_tokens: int) -> None: ...

    def learned_window(self, model: str, endpoint: str | None = None) -> int | None: ...
