"""What makes a user message "contextual" in Codex: context a client injected, not typed by the user
(codex-protocol.md §1.4, `context/contextual_user_message.rs`). A leaf module: the journal's classifier and
the retained-message window both read it."""

from __future__ import annotations

CONTEXTUAL_FRAGMENTS: tuple[str, ...] = (
    "# AGENTS.md instructions",
    "<environment_context>",
    "<turn_aborted>",
    "<user_shell_command>",
    "<subagent_notification>",
    "<recommended_plugins>",
    "<skill>",
    "<user_instructions>",
    "<INSTRUCTIONS>",
)
