"""Computer Use: six sequential desktop tools (seed 004 §5.5) on Linux (X11 + AT-SPI) or macOS (the
ChatGPT.app bundled Codex app-server). Off by default (`computer_use.enabled`)."""

from tools_server.computer_use.family import ComputerUseFamily, create_family

__all__ = ["ComputerUseFamily", "create_family"]
