"""Whether one compaction may call the remote endpoint (seed 004 §5.2): the one rule, shared by
compaction's threshold and overflow recovery (addons/compaction.py) and the context stage's hard trigger
and checkpoint-turn fallback (addons/context.py). Anything it blocks gets the readable fallback instead.

Remote compaction needs: the feature on (`remote_compaction.enabled`), no custom instructions (the remote
endpoint takes none), an eligible route (official, or a trusted upstream), a known auth kind (an item
that could never be proven replayable is not worth fetching), and a compaction endpoint next to the
served `…/responses` request. The credentials go with it only where the one credential rule
(`proxy.routes.may_receive_credentials`, decided by the caller) clears the destination.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from proxy.config import RemoteCompactionConfig
from proxy.routes import Route
from proxy.windows.remote.fingerprint import Fingerprint, fingerprint_of, normalise_endpoint
from proxy.windows.remote.remote import Target, compaction_target


def remote_blocked(cfg: RemoteCompactionConfig, route_eligible: bool, fp: Fingerprint | None) -> str | None:
    """Why the remote call is not even tried (a category), or None."""
    if not cfg.enabled:
        return "off"
    if cfg.custom_instructions:
        return "custom_instructions"
    if not route_eligible:
        return "route"
    if fp is None or fp.auth_kind == "none":
        return "auth_unknown"
    return None


@dataclass(frozen=True)
class RemoteCall:
    """What one compaction of a served request may do remotely."""

    fingerprint: Fingerprint | None  # model / endpoint / account hash / auth kind of the served request
    target: Target | None  # the compaction endpoint beside it (None: there is none)
    blocked: str | None  # why no remote call (a category), else None


def remote_call(cfg: RemoteCompactionConfig, route: Route, scheme: str, host: str, port: int, path: str,
                headers: Mapping[str, str], credentials_allowed: bool, model: str, key: bytes,
                gateway_key: str | None = None) -> RemoteCall:
    """The rule applied to one served request (`headers`: lower-case names)."""
    fp = None
    if route.kind is not None and model:
        fp = fingerprint_of(route.kind, model, normalise_endpoint(scheme, host, port, path), headers, key)
    target = None
    if route.kind is not None:
        target = compaction_target(route.kind, scheme, host, port, path, headers, credentials_allowed, gateway_key)
    blocked = remote_blocked(cfg, route.eligible, fp)
    if blocked is None and target is None:
        blocked = "no_endpoint"
    return RemoteCall(fp, target, blocked)
