"""AT-SPI over D-Bus from the project's venv (dbus-fast), without GObject introspection.

The session bus names the accessibility bus (`org.a11y.Bus.GetAddress`); on that bus the registry's root
lists the applications, and each accessible object speaks `org.a11y.atspi.Accessible` (+ Component,
Action, Text, EditableText). Only the calls the six tools need are here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

from proxy.errors import CtproxyError

ACCESSIBLE = "org.a11y.atspi.Accessible"
COMPONENT = "org.a11y.atspi.Component"
ACTION = "org.a11y.atspi.Action"
TEXT = "org.a11y.atspi.Text"
REGISTRY = "org.a11y.atspi.Registry"
ROOT = "/org/a11y/atspi/accessible/root"
SCREEN_COORDS = 0

# AtspiStateType bit numbers (at-spi2-core atspi-constants.h)
STATE_NAMES = {
    1: "active", 4: "checked", 7: "editable", 8: "enabled", 10: "expanded", 11: "focusable", 12: "focused",
    15: "iconified", 20: "pressed", 22: "selectable", 23: "selected", 24: "sensitive", 25: "showing",
    27: "stale", 30: "visible", 6: "defunct", 41: "checkable", 43: "read-only",
}
SHOWING, VISIBLE, DEFUNCT, FOCUSED, ACTIVE = 25, 30, 6, 12, 1


class AtspiError(CtproxyError):
    """A D-Bus error from the accessibility bus (the object or its app is gone, or the bus is down)."""


@dataclass(frozen=True)
class Ref:
    bus: str
    path: str


def state_bits(words: list[int]) -> set[int]:
    bits = set()
    for i, word in enumerate(words):
        for b in range(32):
            if word & (1 << b):
                bits.add(i * 32 + b)
    return bits


class Atspi:
    def __init__(self, bus: MessageBus, session: MessageBus):
        self.bus = bus
        self._session = session
        # a bus that dies under us (its desktop closed) ends its disconnect future with an error; take it,
        # so it is not reported as "never retrieved" (the next call sees `connected` false and reconnects)
        self._watchers = [asyncio.ensure_future(b.wait_for_disconnect()) for b in (bus, session)]
        for w in self._watchers:
            w.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._role_names: dict[int, str] = {}
        # dbus-fast fails the whole connection when the socket's send buffer fills (EAGAIN), which a
        # tree walk's burst of calls can do: keep the calls in flight bounded
        self._in_flight = asyncio.Semaphore(24)

    @classmethod
    async def connect(cls, session_address: str | None) -> Atspi:
        if session_address:
            session = await MessageBus(bus_address=session_address).connect()
        else:
            session = await MessageBus(bus_type=BusType.SESSION).connect()
        try:
            reply = await session.call(Message(destination="org.a11y.Bus", path="/org/a11y/bus",
                                               interface="org.a11y.Bus", member="GetAddress"))
            if reply.message_type == MessageType.ERROR:
                raise AtspiError(f"no AT-SPI bus on the session bus ({reply.error_name})")
            bus = await MessageBus(bus_address=reply.body[0]).connect()
        except BaseException:
            session.disconnect()
            raise
        return cls(bus, session)

    def close(self) -> None:
        for bus in (self.bus, self._session):
            try:
                bus.disconnect()
            except Exception:  # already gone
                pass

    @property
    def connected(self) -> bool:
        return self.bus.connected

    async def _call(self, ref: Ref, interface: str, member: str, signature: str = "", body: list | None = None,
                    timeout: float = 15.0) -> list[Any]:
        msg = Message(destination=ref.bus, path=ref.path, interface=interface, member=member,
                      signature=signature, body=body or [])
        try:
            async with self._in_flight:
                reply = await asyncio.wait_for(self.bus.call(msg), timeout)
        except TimeoutError as exc:
            raise AtspiError(f"{member} did not answer in {timeout:g} s") from exc
        except (OSError, EOFError) as exc:  # the connection broke; the next call reconnects
            raise AtspiError(f"the accessibility bus connection broke ({type(exc).__name__})") from exc
        if reply is None or reply.message_type == MessageType.ERROR:
            raise AtspiError(reply.error_name if reply is not None else "no reply")
        return reply.body

    async def _prop(self, ref: Ref, interface: str, name: str) -> Any:
        (variant,) = await self._call(ref, "org.freedesktop.DBus.Properties", "Get", "ss", [interface, name])
        return variant.value

    async def applications(self, timeout: float = 15.0) -> list[Ref]:
        (children,) = await self._call(Ref(REGISTRY, ROOT), ACCESSIBLE, "GetChildren", timeout=timeout)
        return [Ref(bus, path) for bus, path in children]

    async def pid_of(self, bus_name: str) -> int | None:
        try:
            (pid,) = await self._call(Ref("org.freedesktop.DBus", "/org/freedesktop/DBus"), "org.freedesktop.DBus",
                                      "GetConnectionUnixProcessID", "s", [bus_name])
            return int(pid)
        except AtspiError:
            return None

    async def name(self, ref: Ref) -> str:
        return str(await self._prop(ref, ACCESSIBLE, "Name") or "")

    async def children(self, ref: Ref) -> list[Ref]:
        (children,) = await self._call(ref, ACCESSIBLE, "GetChildren")
        return [Ref(bus, path) for bus, path in children]

    async def role(self, ref: Ref) -> str:
        (role,) = await self._call(ref, ACCESSIBLE, "GetRole")
        if role not in self._role_names:
            (self._role_names[role],) = await self._call(ref, ACCESSIBLE, "GetRoleName")
        return self._role_names[role]

    async def states(self, ref: Ref) -> set[int]:
        (words,) = await self._call(ref, ACCESSIBLE, "GetState")
        return state_bits(words)

    async def interfaces(self, ref: Ref) -> list[str]:
        (names,) = await self._call(ref, ACCESSIBLE, "GetInterfaces")
        return list(names)

    async def extents(self, ref: Ref) -> tuple[int, int, int, int]:
        (box,) = await self._call(ref, COMPONENT, "GetExtents", "u", [SCREEN_COORDS])
        return int(box[0]), int(box[1]), int(box[2]), int(box[3])

    async def actions(self, ref: Ref) -> list[str]:
        (actions,) = await self._call(ref, ACTION, "GetActions")
        return [a[0] for a in actions]

    async def do_action(self, ref: Ref, index: int) -> bool:
        (ok,) = await self._call(ref, ACTION, "DoAction", "i", [index])
        return bool(ok)

    async def text(self, ref: Ref, limit: int) -> tuple[str, int]:
        count = int(await self._prop(ref, TEXT, "CharacterCount"))
        (text,) = await self._call(ref, TEXT, "GetText", "ii", [0, min(count, limit)])
        return str(text), count

    async def grab_focus(self, ref: Ref) -> bool:
        (ok,) = await self._call(ref, COMPONENT, "GrabFocus")
        return bool(ok)
