"""The threshold reminder (seed 000 "checkpoint fence 与换窗"): at `context.reminder_ratio` of the model's
window, a hidden developer message at the end of the forwarded copy asks the model to save a checkpoint
note and call `new_context`. Pure: the caller gives the recorded usage and the window size.

Hidden: only the forwarded copy carries it (the agent's history and the journal never do), and one the
agent resent is dropped, so it never accumulates. It is said once per window, last, and then kept where it was
said in every later request of the window (`Said`): the window's prefix stays byte-identical for the upstream's
prompt cache (issue 47: a reminder re-said at the end of each request broke the prefix at every request).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from proxy.items.lazyitems import is_item_list
from proxy.windows.notes.bootstrap import developer_message, seen_as

REMINDER_MARKER = "<ctproxy_context_reminder>"
REMINDER_END = "</ctproxy_context_reminder>"
WRITE_TOOLS = ("notes_write_file", "notes_append_to_file")


def is_reminder(item: Any) -> bool:
    if not isinstance(item, dict) or item.get("role") != "developer" or item.get("type", "message") != "message":
        return False  # (the role first: one lookup decides for almost every item)
    content = item.get("content")
    first = content if isinstance(content, str) else (
        content[0].get("text") if isinstance(content, list) and content and isinstance(content[0], dict) else None)
    return isinstance(first, str) and first.startswith(REMINDER_MARKER)


def reminder_due(used_tokens: int, window_tokens: int | None, ratio: float) -> bool:
    return bool(window_tokens) and used_tokens >= ratio * window_tokens  # type: ignore[operator]


def can_remind(tools: Sequence[str]) -> bool:
    """The reminder asks for a note and new_context: only a session that can call both gets it."""
    return "new_context" in tools and any(t in tools for t in WRITE_TOOLS)


def reminder_text(used_tokens: int, window_tokens: int, tools: Sequence[str]) -> str:
    write = seen_as(tools, next(t for t in WRITE_TOOLS if t in tools))
    pct = min(100, used_tokens * 100 // window_tokens)
    then = seen_as(tools, "new_context")
    return (f"{REMINDER_MARKER}\nThis context window is about {pct}% full ({used_tokens} of {window_tokens} "
            f"tokens). Save a checkpoint note now with {write} (what the task is, what is done, what remains, "
            f"the window and item ids worth re-reading), then call {then}. The next window starts with "
            f"an index of your notes; continue the work there.\n{REMINDER_END}")


def with_reminder(items: Sequence[Any], text: str | None,
                  developers: Sequence[int] | None = None) -> Sequence[Any]:
    """`items` without any resent reminder, and with `text` as the last item when given. `developers`:
    positions that include every developer message of `items`, when known (the rest is not walked)."""
    if developers is not None and not any(is_reminder(items[k]) for k in developers):
        if text is None:
            return items if is_item_list(items) else list(items)
        return [*items, developer_message(text)]
    out = [item for item in items if not is_reminder(item)]
    if text is None and len(out) == len(items):
        return items if is_item_list(items) else out  # nothing to drop or add: the same list
    if text is not None:
        out.append(developer_message(text))
    return out


MAX_SAID = 4096  # windows whose reminder is remembered (the least recently used forgotten first)


class Said:
    """Where each window's reminder was said: (position in the forwarded input, its text), by (session, window),
    per journal (held weakly: two state directories, or two tests, in one process never share one)."""

    def __init__(self, limit: int = MAX_SAID):
        self._by_journal: weakref.WeakKeyDictionary[Any, OrderedDict[tuple[str, str], tuple[int, str]]] = \
            weakref.WeakKeyDictionary()
        self._limit = limit

    def get(self, journal: Any, session: str, window: str) -> tuple[int, str] | None:
        try:
            said = self._by_journal.get(journal)
        except TypeError:  # a journal that cannot be held weakly: nothing remembered (said again at the end)
            return None
        return said.get((session, window)) if said is not None else None

    def put(self, journal: Any, session: str, window: str, at: int, text: str) -> None:
        try:
            said = self._by_journal.setdefault(journal, OrderedDict())
        except TypeError:
            return
        said[(session, window)] = (at, text)
        while len(said) > self._limit:
            said.popitem(last=False)


SAID = Said()  # the process's: a reminder is the forwarded copy's own, never journaled


def with_said(items: Sequence[Any], said: tuple[int, str], developers: Sequence[int] | None = None) -> Sequence[Any]:
    """`items` without any resent reminder, with the window's reminder back where it was said (left out when the
    input no longer reaches that far: the agent resent less than the window had)."""
    at, text = said
    out = list(with_reminder(items, None, developers))
    if at > len(out):
        return out
    return [*out[:at], developer_message(text), *out[at:]]
