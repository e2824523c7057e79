"""Compaction's own record of a flow: what its request hook found, for its response hooks. Written by
compaction only; what other stages read is the request's window decision (`FlowState.window`,
proxy/windows/decision.py), made from this record and derived, never edited, by later steps.

Kept out of the addon module: mitmproxy loads `-s` scripts without registering them in
`sys.modules`, where `dataclasses` looks up a class's module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy import routes
from proxy.windows.remote.decision import Estimate
from proxy.windows.remote.fingerprint import Fingerprint
from proxy.windows.remote.journal_link import WindowSession
from proxy.windows.remote.remote import Target
from proxy.windows.remote.store import Checkpoint


@dataclass(kw_only=True)
class FlowInfo:
    """What the request hook decided, for the response hooks."""

    session_key: str
    payload: dict[str, Any]  # the client's payload as sent (never mutated; a big input may be a LazyItems)
    client_items: Sequence[Any]  # its input items: a list, or a big body's LazyItems (built where rewritten)
    checkpoint: Checkpoint | None  # the checkpoint in effect (None when absent or diverged)
    replay_opaque: bool
    window: int | None
    estimate: Estimate
    route: routes.Route
    credentials_allowed: bool
    hold: bool
    mark: Any = None  # the journal's RequestMark, when the history addon ran
    held_stream: Any = None  # the stream callable displaced by holding
    outcome: str = "none"
    compacted: bool = False  # this agent request already caused a compaction (at most one per request)
    compacted_items: int | None = None  # client items at the session's last compaction
    endpoint: str | None = None  # the normalised endpoint, the learned window's key with the model
    windows: WindowSession | None = None  # the journal session whose windows this request reads and opens
    # The request's fingerprint (what a replayed compaction item must match) and the compaction endpoint as of
    # the request hook (a later stage, the bridge, re-routes the flow and takes its credentials off before the
    # answer, when an overflow recovery compacts): made on first use from what the hook saw, since most
    # requests neither compact nor replay (≈28 µs a request made eagerly, in `ctproxy up`).
    make_fingerprint: Callable[[], Fingerprint | None] | None = field(default=None, repr=False)
    make_target: Callable[[], Target | None] | None = field(default=None, repr=False)
    _fingerprint: Fingerprint | None = field(default=None, repr=False)
    _target: Target | None = field(default=None, repr=False)

    @property
    def fingerprint(self) -> Fingerprint | None:
        if self.make_fingerprint is not None:
            self._fingerprint, self.make_fingerprint = self.make_fingerprint(), None
        return self._fingerprint

    @property
    def target(self) -> Target | None:
        if self.make_target is not None:
            self._target, self.make_target = self.make_target(), None
        return self._target
