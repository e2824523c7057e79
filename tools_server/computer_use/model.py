"""Typed contracts between the family and its backends (Linux X11 + AT-SPI, macOS app-server)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from tools_server.computer_use.approval import Approvals, Confirm

Button = Literal["left", "right", "middle"]
Direction = Literal["up", "down", "left", "right"]


@dataclass(frozen=True)
class AppInfo:
    name: str  # the canonical app id: what approvals are keyed by
    pid: int | None = None
    windows: tuple[str, ...] = ()
    active: bool = False
    ident: str = ""  # an unambiguous way to name it (e.g. "pid:1234"), when the name is shared


@dataclass(frozen=True)
class Target:
    """Where an action lands: an element index from the last get_app_state first, else screenshot
    coordinates (pixels, relative to that screenshot)."""

    element_index: int | None = None
    x: float | None = None
    y: float | None = None


@dataclass
class Screenshot:
    data: bytes
    mime_type: str
    width: int = 0
    height: int = 0


@dataclass
class AppState:
    app: str
    text: str  # the numbered accessibility tree, as the model reads it
    screenshot: Screenshot | None
    details: dict = field(default_factory=dict)


@dataclass
class ActionCall:
    """One dispatched action: the tool, the app as the caller named it, how to ask the user."""

    tool: str
    app: str
    approvals: Approvals
    confirm: Confirm | None


class Backend(Protocol):
    name: str

    async def list_apps(self, call: ActionCall) -> list[AppInfo]: ...

    async def resolve(self, call: ActionCall) -> AppInfo:
        """The one app the caller means, or a clear error (not found, ambiguous, closed)."""
        ...

    async def get_app_state(self, call: ActionCall, app: AppInfo) -> AppState: ...

    async def click(self, call: ActionCall, app: AppInfo, target: Target, button: Button, count: int) -> str: ...

    async def type_text(self, call: ActionCall, app: AppInfo, text: str) -> str: ...

    async def press_key(self, call: ActionCall, app: AppInfo, key: str) -> str: ...

    async def scroll(self, call: ActionCall, app: AppInfo, target: Target, direction: Direction,
                     amount: int) -> str: ...

    async def close(self) -> None: ...
