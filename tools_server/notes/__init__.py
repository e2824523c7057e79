"""The notes tool family (seed 000): notes_list_files_by_prefix, notes_read_file, notes_search_contents,
notes_append_to_file, notes_write_file — real files under `<state>/notes/<task>/<agent-hash>/`."""

from __future__ import annotations

from tools_server.notes.family import NotesFamily
from tools_server.registry import Services


def create_family(services: Services) -> NotesFamily:
    return NotesFamily(services)
