"""The one capability table (DESIGN §6): what each capability is, where it runs, whether this build has it,
and the tools it gives. Config (the switch names), `ctproxy status`, the tool server's families and the
CLI's choices all read this table; a test holds the tool server's registry to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Capability:
    name: str  # also the config section whose `enabled` switches it
    summary: str  # what it does, as `ctproxy status` says it
    runs_in: Literal["proxy", "tool server"]
    built: bool  # implemented in this version (False: status says "not built in this version yet")
    tools: tuple[str, ...] = ()  # the tools it adds to the tool server (REST, MCP, later the bridge)
    seed: str = ""  # where its contract is (seed document § or issue)


TABLE: tuple[Capability, ...] = (
    Capability("web_search", "native web_search injected on official routes", "proxy", True, (), "004 §5.1"),
    Capability("remote_compaction", "remote compaction v2 with a readable fallback", "proxy", True, (), "004 §5.2"),
    Capability("context", "get_context_remaining from recorded usage; new_context and the manual checkpoint mark "
               "a pending rollover", "tool server", True, ("get_context_remaining", "new_context"), "000"),
    Capability("history", "journal of every exchanged item + history_* tools", "proxy", True,
               ("history_list_windows", "history_list_items", "history_read_item", "history_search_contents"),
               "000"),
    Capability("notes", "notes_* tools over files in the state directory", "tool server", True,
               ("notes_list_files_by_prefix", "notes_read_file", "notes_search_contents", "notes_append_to_file",
                "notes_write_file"), "000"),
    Capability("apply_patch", "apply_patch tool (JSON + Lark grammar)", "tool server", True, ("apply_patch",),
               "004 §5.4"),
    Capability("shell", "exec_command / write_stdin shell sessions", "tool server", True,
               ("exec_command", "write_stdin"), "004 §5.6"),
    Capability("code_mode", "exec / wait JavaScript cells in V8 isolates", "tool server", True,
               ("exec", "wait"), "004 §5.7"),
    Capability("image_generation", "openai_generate_image (gpt-image-2, one image per call)", "tool server", True,
               ("openai_generate_image",), "004 §5.3"),
    Capability("sidecar_search", "openai_web_search sidecar tool (on with web_search.backend + sidecar_model)",
               "tool server", True, ("openai_web_search",), "004 §5.1"),
    Capability("tool_discovery", "find_tools: deferred tools loaded per session", "tool server", True,
               ("find_tools",), "004 §5.8"),
    Capability("computer_use", "computer_use_* desktop tools (Linux X11 + AT-SPI; macOS app-server)", "tool server",
               True,
               ("computer_use_list_apps", "computer_use_get_app_state", "computer_use_click",
                "computer_use_type_text", "computer_use_press_key", "computer_use_scroll"), "004 §5.5"),
)

BY_NAME: dict[str, Capability] = {c.name: c for c in TABLE}
NAMES: tuple[str, ...] = tuple(c.name for c in TABLE)


def capability(name: str) -> Capability:
    return BY_NAME[name]
