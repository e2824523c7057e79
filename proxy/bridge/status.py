"""What `ctproxy status` says about the bridge: for every family with tools, bridged or not and why (pure).

Judged from the config the running proxy runs (run.json's snapshot, `--bridge` included) and the
capability statuses (`proxy.app.status.capability_status`): a family is bridged when it is in
`bridge.families`, its capability is active and ctproxy runs its tool server. Which tools a request
really gets also depends on the agent: its own tool of the same name always wins (said on the line).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from proxy.capabilities import capability
from proxy.config import BRIDGEABLE, Config


@dataclass(frozen=True)
class BridgeStatus:
    family: str
    bridged: bool
    reason: str
    tools: tuple[str, ...]


def bridge_statuses(config: Config, run: dict | None, state_of: Callable[[str], tuple[str, str]],
                    displaced: dict[str, int] | None = None) -> list[BridgeStatus]:
    """`state_of(capability) -> (state, reason)` as `ctproxy status` reports the capability; `displaced`:
    bridged tools the running proxy left out because the agent had its own of that name (requests)."""
    displaced = displaced or {}
    wanted = config.bridge.families
    out = []
    for name in BRIDGEABLE:
        tools = capability(name).tools
        if name not in wanted:
            out.append(BridgeStatus(name, False, "not in bridge.families (ctproxy up --bridge …)", tools))
            continue
        state, why = state_of(name)
        if state != "active":
            out.append(BridgeStatus(name, False, f"{name} is {state}: {why}", tools))
        elif run is not None and not run.get("tools"):
            out.append(BridgeStatus(name, False, "no tool server in this run (--no-tools)", tools))
        else:
            shown = ", ".join(f"{t} ({n} request{'s' if n != 1 else ''})" for t, n in sorted(displaced.items())
                              if t in tools)
            why = (f"offered after the agent's own tools; displaced by an agent tool of the same name: {shown}"
                   if shown else "offered to every agent after its own tools; an agent tool of the same name wins")
            out.append(BridgeStatus(name, True, why, tools))
    return out


def read_seen(path: Path, run: dict | None) -> dict[str, int]:
    """What the running proxy's bridge saw (proxy/bridge/server.py, SEEN_FILE); nothing without a run."""
    if not run:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("pid") != run.get("pid") or not isinstance(data.get("displaced"), dict):
        return {}  # another (earlier) run's
    return {str(k): int(v) for k, v in data["displaced"].items() if isinstance(v, int)}


def render_lines(statuses: list[BridgeStatus], max_rounds: int) -> list[str]:
    if not any(s.bridged for s in statuses) and all(s.reason.startswith("not in") for s in statuses):
        return ["", "bridge:    off (no family bridged: requests pass unchanged; ctproxy up --bridge history,notes,"
                "context)"]
    lines = ["", f"bridge:    up to {max_rounds} rounds of bridged calls per request"]
    width = max(len(s.family) for s in statuses)
    for s in statuses:
        lines.append(f"  {s.family:<{width}}  {'bridged' if s.bridged else 'not bridged':<11}  {s.reason}")
    return lines
