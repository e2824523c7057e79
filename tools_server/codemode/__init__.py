"""Code mode (seed 004 §5.7): `exec` / `wait` over JavaScript cells in V8 isolates."""

from tools_server.codemode.family import CodeModeFamily, create_family

__all__ = ["CodeModeFamily", "create_family"]
