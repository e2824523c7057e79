"""The window service's wiring to the runtime (ADR 0011): what the stages share to read and open windows.
Kept out of the strategy rooms, so `proxy/compaction/` and `proxy/context/` never import the runtime (that
import closed a loop: runtime → bridge → flowstate → compaction → runtime)."""

from __future__ import annotations

from proxy import runtime
from proxy.journal import Journal, journal_for


def journal_of(rt: runtime.Runtime, from_history: Journal | None) -> Journal:
    """The journal a request's windows live in: the history stage's, or, when history is not in the chain,
    the one kept here (it then holds the session and its windows, without items)."""
    if isinstance(from_history, Journal):
        return from_history
    j = rt.services.journal
    if j is None:
        j = rt.services.journal = journal_for(rt.state, rt.config.history.cache_mb << 20)
    return j
