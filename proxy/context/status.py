"""What `ctproxy status` says about `context`: exactly what is active, nothing that is not wired yet."""

from __future__ import annotations

from proxy.config import Config

# Set to True by whoever wires the projection stage (addons/context.py) to consume pending rollovers
# and forward `build_bootstrap`'s window (docs/context.md). Until then a rollover stays pending.
PROJECTION_WIRED = True


def context_status(config: Config) -> tuple[str, str]:
    c = config.context
    tools = (f"get_context_remaining (from the agent's last recorded usage; hard trigger at {c.hard_ratio:.0%} of "
             "the window) and new_context / `ctproxy context checkpoint` (mark a pending rollover)")
    if PROJECTION_WIRED:
        ids = "on" if c.id_projection else "off"
        hard = ("the proxy runs the checkpoint turn (own-notes write required) and rolls over, falling back to the "
                "readable compaction fallback when the turn fails" if c.strategy == "notes" else
                f"strategy {c.strategy}: left to compaction's own threshold (no checkpoint turn)")
        return "active", (f"{tools}; the proxy rolls over at the session's next request with the notes bootstrap; "
                          f"guidance where its tools are reachable; [id: …] projection {ids} (sessions that can call "
                          f"history_read_item); reminder at {c.reminder_ratio:.0%}; at {c.hard_ratio:.0%} {hard}; a "
                          "manual checkpoint runs the same turn at the next request where notes_write_file is "
                          "reachable, else it stays pending")
    return "active", (f"{tools}; not applied yet: the proxy does not roll over, bootstrap, add guidance or "
                      "[id: …] markers until the projection stage consumes pending rollovers (docs/context.md)")
