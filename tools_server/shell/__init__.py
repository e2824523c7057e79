"""Shell sessions: exec_command / write_stdin over pipes, with output recovery (seed 004 §5.6)."""

from tools_server.shell.family import ShellFamily, create_family

__all__ = ["ShellFamily", "create_family"]
