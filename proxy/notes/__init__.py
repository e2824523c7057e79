"""Agents' notes: real files per task and agent, written under a cross-process lock."""

from proxy.notes.paths import NotePathError, NoteRef, parse
from proxy.notes.store import NOTE_MAX_BYTES, NoteError, NoteInfo, NotesStore

__all__ = ["NOTE_MAX_BYTES", "NoteError", "NoteInfo", "NotePathError", "NoteRef", "NotesStore", "parse"]
