"""What `ctproxy status` says about `context`: exactly what is active, nothing that is not wired yet."""

from __future__ import annotations

from proxy.config import Config

# Set to True by whoever wires the projection stage (addons/context.py) to consume pending rollovers
# and forward `build_bootstrap`'s window (docs/context.md). Until then a rollover stays pending.
PROJECTION_WIRED = True


def compaction_kind(config: Config) -> str:
    """What a compaction made by the context stage is, as far as the configuration decides it (the route
    and the request's auth kind decide the rest: proxy/windows/remote/eligibility.py)."""
    rc = config.remote_compaction
    if not rc.enabled:
        return "the readable compaction fallback (remote_compaction.enabled is false)"
    if rc.custom_instructions:
        return "the readable compaction fallback (remote_compaction.custom_instructions is set)"
    return ("remote compaction v2 where the route and auth kind are eligible, else the readable compaction "
            "fallback")


def hard_trigger(config: Config) -> str:
    """What the hard trigger does under `context.strategy`."""
    c = config.context
    if c.strategy == "notes":
        return ("strategy notes: the proxy runs the checkpoint turn (own-notes write required, where notes_write_file "
                f"is reachable) and rolls over; when the turn fails, {compaction_kind(config)}")
    if c.strategy == "remote":
        return f"strategy remote: no checkpoint turn, the proxy compacts the window first: {compaction_kind(config)}"
    return "strategy fallback: no checkpoint turn, the proxy replaces the window by the readable compaction fallback"


def manual(config: Config) -> str:
    """What a manual checkpoint (`ctproxy context checkpoint`, the REST call) does under `context.strategy`."""
    if config.context.strategy == "notes":
        return ("a manual checkpoint runs the checkpoint turn at the next request where notes_write_file is "
                "reachable, else it stays pending")
    return "a manual checkpoint compacts at the next request, as the hard trigger does"


def context_status(config: Config) -> tuple[str, str]:
    c = config.context
    tools = (f"get_context_remaining (from the agent's last recorded usage; hard trigger at {c.hard_ratio:.0%} of "
             "the window) and new_context / `ctproxy context checkpoint` (mark a pending rollover)")
    if PROJECTION_WIRED:
        ids = "on" if c.id_projection else "off"
        return "active", (f"{tools}; the proxy rolls over at the session's next request with the notes bootstrap "
                          "(a bridged new_context: at the bridge's next round); "
                          f"guidance where its tools are reachable; [id: …] projection {ids} (sessions that can call "
                          f"history_read_item); reminder at {c.reminder_ratio:.0%}; at {c.hard_ratio:.0%} "
                          f"{hard_trigger(config)}; {manual(config)}")
    return "active", (f"{tools}; not applied yet: the proxy does not roll over, bootstrap, add guidance or "
                      "[id: …] markers until the projection stage consumes pending rollovers (docs/context.md)")
